//! Dispatch: an instance thread takes the next batch (by priority, shape and affinity),
//! executes it under `catch_unwind`, and delivers each response (in order when asked).

use super::*;

pub(crate) enum Next {
    Batch(Vec<Job>),
    Wait(Option<Instant>),
    Exit,
}

impl Shared {
    /// Decides what free instance number `me` does next.
    pub(crate) fn next(&self, state: &mut State, now: Instant, me: usize) -> Next {
        let p = &self.policy;
        // (level, delayed?, index) of candidates in service order
        let order = state.levels.iter().enumerate().flat_map(|(l, lv)| {
            (0..lv.queue.len())
                .map(move |i| (l, false, i))
                .chain((0..lv.delayed.len()).map(move |i| (l, true, i)))
        });
        let job = |l: usize, d: bool, i: usize| -> &Job {
            let lv = &state.levels[l];
            if d {
                &lv.delayed[i]
            } else {
                &lv.queue[i]
            }
        };
        let mut picked: Vec<(usize, bool, usize)> = Vec::new();
        let mut rows = 0;
        let mut blocked = false;
        let mut first_key = None;
        let mut other_shapes = 0usize;
        // With no pinned request queued, every queued request of the batch's shape is in
        // `state.shapes`, so the batch can stop looking once it holds them all (how many: looked
        // up once, with the batch's shape).
        let none_pinned = state.shapes.unpinned == state.queued;
        let mut of_key = None;
        for (l, d, i) in order {
            let j = job(l, d, i);
            if j.affinity.is_some_and(|a| a != me) {
                continue;
            }
            if !p.dynamic {
                picked.push((l, d, i));
                break;
            }
            let key = *first_key.get_or_insert(j.shape_key);
            if j.shape_key != key {
                // Another shape waits: the batch is the oldest request and the queued requests
                // of its shape up to SHAPE_LOOKAHEAD requests of other shapes past it (later
                // ones of other shapes wait for the next batch, so none starves), and it goes
                // now rather than after the queue delay.
                blocked = true;
                other_shapes += 1;
                if other_shapes > SHAPE_LOOKAHEAD {
                    break;
                }
                continue;
            }
            if rows + j.rows > p.max_batch_size.max(1) {
                blocked = !picked.is_empty();
                break;
            }
            rows += j.rows;
            picked.push((l, d, i));
            if rows == p.max_batch_size {
                break;
            }
            let queued_of_key = *of_key.get_or_insert_with(|| state.shapes.count(key));
            if none_pinned && picked.len() == queued_of_key {
                // The rest are of other shapes (scanning on would find only them).
                blocked |= state.queued > picked.len();
                break;
            }
        }
        if picked.is_empty() {
            if state.stopping {
                return Next::Exit;
            }
            return Next::Wait(self.instance_deadline(state));
        }
        let all_that_can_come = self.demand.get().is_some_and(|d| {
            d.get(me)
                .is_some_and(|n| picked.len() >= n.load(Ordering::Relaxed))
        });
        let send_all = !p.dynamic
            || state.stopping
            || blocked
            || all_that_can_come
            || rows >= p.max_batch_size
            || p.max_queue_delay.is_zero();
        if !send_all {
            // The largest prefix whose size is a preferred batch size goes at once.
            let mut sum = 0;
            let mut cut = None;
            for (n, &(l, d, i)) in picked.iter().enumerate() {
                sum += job(l, d, i).rows;
                if p.preferred.contains(&sum) {
                    cut = Some(n + 1);
                }
            }
            let oldest = picked
                .iter()
                .map(|&(l, d, i)| job(l, d, i).enqueued)
                .min()
                .expect("picked is not empty");
            let due = oldest + p.max_queue_delay;
            match cut {
                Some(n) => picked.truncate(n),
                None if now >= due => {}
                None => {
                    let earliest = self.instance_deadline(state);
                    return Next::Wait(Some(earliest.map_or(due, |d| d.min(due))));
                }
            }
        }
        // Take the picked jobs out, highest index first so earlier indices stay valid.
        picked.sort_by(|a, b| b.cmp(a));
        let mut batch: Vec<Job> = picked
            .into_iter()
            .map(|(l, d, i)| {
                let lv = &mut state.levels[l];
                if d {
                    lv.delayed.remove(i)
                } else {
                    lv.queue.remove(i)
                }
                .expect("picked index is valid")
            })
            .collect();
        batch.sort_by_key(|j| j.seq);
        state.left_queue(&batch);
        Next::Batch(batch)
    }

    pub(crate) fn deliver(&self, seq: u64, respond: Responder, result: Result<InferResponse>) {
        if !self.policy.preserve_ordering {
            respond(result);
            return;
        }
        let mut due = Vec::new();
        {
            let mut o = self.ordered.lock().expect("ordering lock");
            o.ready.insert(seq, (respond, result));
            while let Some(entry) = {
                let next = o.next;
                o.ready.remove(&next)
            } {
                o.next += 1;
                due.push(entry);
            }
        }
        for (respond, result) in due {
            respond(result);
        }
    }

    pub(crate) fn finish_failed(&self, job: Job, err: Error, reason: FailReason) {
        self.stats.record_failure(reason, job.enqueued.elapsed());
        self.inflight.fetch_sub(1, Ordering::SeqCst);
        if let Some(o) = &self.observer {
            o(&RequestTiming {
                ok: false,
                total: job.enqueued.elapsed(),
                queue: job.enqueued.elapsed(),
                exec: ExecTiming::default(),
                elements: input_elements(&job.request),
            });
        }
        self.deliver(job.seq, job.respond, Err(err));
    }
}

/// The loop of the thread started for instance `me`, until it retires or the scheduler stops.
pub(crate) fn run_instance(shared: &Shared, slot: &Slot, me: usize) {
    if let Some(i) = slot.lock().as_mut() {
        i.on_thread_start();
    }
    loop {
        let mut rejected = Vec::new();
        let batch = {
            let mut state = shared.state.lock().expect("scheduler lock");
            loop {
                if state.retiring > 0 {
                    state.retiring -= 1;
                    return;
                }
                let now = Instant::now();
                shared.expire(&mut state, now, &mut rejected, false);
                if !rejected.is_empty() {
                    break None;
                }
                match shared.next(&mut state, now, me) {
                    Next::Batch(b) => break Some(b),
                    Next::Exit => return,
                    Next::Wait(None) => {
                        state = shared.ready.wait(state).expect("scheduler lock");
                    }
                    Next::Wait(Some(t)) => {
                        let d = t.saturating_duration_since(now);
                        state = shared
                            .ready
                            .wait_timeout(state, d)
                            .expect("scheduler lock")
                            .0;
                    }
                }
            }
        };
        shared.reject_expired(rejected);
        if let Some(batch) = batch {
            let mut guard = slot.lock();
            match guard.as_mut() {
                Some(i) => run_batch(shared, slot, i.as_mut(), batch),
                // Only this thread empties its slot, when it leaves: cannot happen.
                None => {
                    for job in batch {
                        let e = Error::internal(format!(
                            "model '{}': instance {me} is gone",
                            shared.model
                        ));
                        shared.finish_failed(job, e, FailReason::Backend);
                    }
                }
            }
        }
    }
}

/// Executes `batch` on `slot`'s instance (held by the caller), with the slot marked busy.
pub(crate) fn run_batch(
    shared: &Shared,
    slot: &Slot,
    instance: &mut dyn Instance,
    batch: Vec<Job>,
) {
    // Under the rate limiter, wait for this instance's resources (held until it is done).
    // The batch is still queued meanwhile, as in Triton: a request whose REJECT queue
    // timeout passes while it waits is answered with the timeout, and the rest wait on.
    let mut batch = batch;
    let mut _permit = None;
    if let Some(l) = shared.limits.get() {
        if let Some(needs) = l
            .needs
            .get(slot.index)
            .or(l.needs.last())
            .filter(|n| !n.resources.is_empty())
        {
            loop {
                let due = batch.iter().filter_map(|j| j.reject_at).min();
                if let Some(p) = l.limiter.acquire_until(slot.id, needs, due) {
                    _permit = Some(p);
                    break;
                }
                let now = Instant::now();
                let (expired, waiting): (Vec<Job>, Vec<Job>) = batch
                    .into_iter()
                    .partition(|j| j.reject_at.is_some_and(|d| d <= now));
                shared.reject_expired(expired);
                batch = waiting;
                if batch.is_empty() {
                    return;
                }
            }
        }
    }
    slot.busy.store(
        shared.epoch.elapsed().as_nanos() as u64 + 1,
        Ordering::Relaxed,
    );
    execute(shared, instance, batch);
    slot.busy.store(0, Ordering::Relaxed);
}

pub(crate) fn execute(shared: &Shared, instance: &mut dyn Instance, batch: Vec<Job>) {
    let dispatched = Instant::now();
    let rows: usize = batch.iter().map(|j| j.rows).sum();
    let mut requests = Vec::with_capacity(batch.len());
    let mut metas = Vec::with_capacity(batch.len());
    for j in batch {
        metas.push((j.seq, j.respond, j.enqueued, input_elements(&j.request)));
        requests.push(j.request);
    }
    let mut timing = ExecTiming::default();
    let started_wall = wisp_core::trace::unix_ns(std::time::SystemTime::now());
    let started = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| {
        instance.execute(&requests, &mut timing)
    }));
    let took = started.elapsed().as_nanos() as u64;
    let recent = shared.recent_exec_ns.load(Ordering::Relaxed);
    let took_1 = took.max(1);
    shared.recent_exec_ns.store(
        if recent == 0 {
            took_1
        } else {
            (recent.saturating_mul(7).saturating_add(took_1)) / 8
        },
        Ordering::Relaxed,
    );
    if timing == ExecTiming::default() {
        timing.infer_ns = took;
    }
    for t in requests.iter().filter_map(|r| r.trace.as_ref()) {
        t.mark_at("COMPUTE_START", started_wall);
        t.mark_at(
            "COMPUTE_INPUT_END",
            started_wall.saturating_add(timing.input_ns),
        );
        t.mark_at(
            "COMPUTE_OUTPUT_START",
            started_wall.saturating_add(took.saturating_sub(timing.output_ns)),
        );
        t.mark_at("COMPUTE_END", started_wall.saturating_add(took));
    }
    let n = requests.len();
    let results: Vec<Result<InferResponse>> = match result {
        Ok(v) if v.len() == n => v,
        Ok(v) => {
            let e = Error::internal(format!(
                "model '{}': backend returned {} responses for {n} requests",
                shared.model,
                v.len()
            ));
            (0..n).map(|_| Err(e.clone())).collect()
        }
        Err(_) => {
            let e = Error::internal(format!(
                "model '{}': backend panicked while executing",
                shared.model
            ));
            (0..n).map(|_| Err(e.clone())).collect()
        }
    };
    let mut results = results;
    for r in results.iter_mut().flatten() {
        r.compute = Some(timing);
    }
    let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
    if ok > 0 {
        shared.stats.record_execution(rows, ok, timing);
    }
    for ((seq, respond, enqueued, elements), result) in metas.into_iter().zip(results) {
        let total = enqueued.elapsed();
        let queue = dispatched - enqueued;
        match &result {
            Ok(_) => {
                shared.stats.success.add(total);
                shared.stats.queue.add(queue);
            }
            Err(_) => {
                shared.stats.record_failure(FailReason::Backend, total);
            }
        }
        if let Some(o) = &shared.observer {
            o(&RequestTiming {
                ok: result.is_ok(),
                total,
                queue,
                exec: timing,
                elements,
            });
        }
        shared.inflight.fetch_sub(1, Ordering::SeqCst);
        shared.deliver(seq, respond, result);
    }
}

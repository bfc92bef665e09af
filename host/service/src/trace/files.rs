//! Trace files: the writer thread, rotation and bounded, no-follow writes.

use super::*;

/// The writer thread: keeps traces, writes a file every `log_frequency` of them or when told;
/// with an `exporter`, turns each trace into spans for it instead.
pub(super) fn write_loop(
    rx: std::sync::mpsc::Receiver<Msg>,
    exporter: Option<Arc<dyn TraceExport>>,
) {
    let mut pending = Pending::default();
    while let Ok(msg) = rx.recv() {
        match (msg, &exporter) {
            (Msg::Traces(traces, ..), Some(e)) => traces.iter().for_each(|t| e.export(t)),
            (Msg::Flush(done), Some(e)) => {
                e.flush();
                let _ = done.send(());
            }
            (msg, None) => match msg {
                Msg::Traces(traces, file, frequency) => {
                    if file != pending.file && !pending.traces.is_empty() {
                        write_pending(&mut pending);
                    }
                    pending.file = file;
                    pending.log_frequency = frequency;
                    for trace in traces {
                        if pending.traces.len() < MAX_BUFFERED_TRACES {
                            pending.traces.push(trace);
                        }
                        if frequency > 0 && pending.traces.len() as u64 >= frequency {
                            write_pending(&mut pending);
                        }
                    }
                }
                Msg::Flush(done) => {
                    write_pending(&mut pending);
                    let _ = done.send(());
                }
            },
        }
    }
    write_pending(&mut pending);
}

/// Writes the waiting traces as one file: a JSON array of Triton's trace objects.
pub(super) fn write_pending(p: &mut Pending) {
    if p.traces.is_empty() || p.file.is_empty() {
        p.traces.clear();
        return;
    }
    let path = if p.log_frequency > 0 {
        p.index += 1;
        format!("{}.{}", p.file, p.index - 1)
    } else {
        p.flushes += 1;
        if p.flushes == 1 {
            p.file.clone()
        } else {
            format!("{}.{}", p.file, p.flushes - 1)
        }
    };
    let mut body = Vec::with_capacity(p.traces.len() * 512 + 2);
    body.push(b'[');
    for (n, t) in p.traces.drain(..).enumerate() {
        if n > 0 {
            body.push(b',');
        }
        t.write_json(&mut body);
    }
    body.push(b']');
    if let Err(e) = write_whole(Path::new(&path), &body) {
        tracing::error!(path, error = %e, "cannot write the trace file");
        return;
    }
    p.kept.retain(|(kept, _)| *kept != path);
    p.kept.push_back((path, body.len() as u64));
    let mut total: u64 = p.kept.iter().map(|(_, n)| n).sum();
    while p.kept.len() > MAX_TRACE_FILES || (total > MAX_TRACE_FILE_BYTES && p.kept.len() > 1) {
        let Some((old, n)) = p.kept.pop_front() else {
            break;
        };
        total -= n;
        if let Err(e) = std::fs::remove_file(&old) {
            tracing::warn!(path = old, error = %e, "cannot remove an old trace file");
        }
    }
}

/// Writes `body` beside `path` under a hidden name and renames it into place, so a reader
/// (a log shipper, a test polling the directory) never sees a created but half-written file.
pub(super) fn write_whole(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let partial = path.with_file_name(format!(".{name}.partial"));
    // A leftover (or a link planted there) is removed, not followed; the new file is created
    // afresh (O_EXCL) without following links, and the rename replaces a link at `path`
    // rather than writing through it.
    match std::fs::remove_file(&partial) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, libc::O_NOFOLLOW);
    let written = opts
        .open(&partial)
        .and_then(|mut f| std::io::Write::write_all(&mut f, body));
    written
        .and_then(|()| std::fs::rename(&partial, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&partial);
        })
}

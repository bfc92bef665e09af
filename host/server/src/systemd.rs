//! systemd integration through `sd_notify` (the `sd-notify` crate): `READY=1` once every model
//! has loaded and the listeners are bound (`Type=notify`), `STOPPING=1` on shutdown, and the
//! watchdog (`WatchdogSec=`).
//!
//! The watchdog pings `WATCHDOG=1` every half period from a task on the serving runtime, and
//! only while the server is alive as a whole: the runtime runs the task (a wedged async loop
//! stops it), and no model instance has been inside one execution for longer than
//! `--instance-stall-secs` (a wedged instance thread stops it). When the pings stop, systemd
//! kills and restarts the service. It says in the log why it stopped pinging, and when it
//! resumes.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset) every call here does nothing.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;

/// Where notifications go: the systemd socket, or a test's recorder.
pub trait Notifier: Send + Sync {
    /// Sends `state` to the service manager.
    fn notify(&self, state: &[NotifyState]) -> std::io::Result<()>;
}

/// The service manager named by `NOTIFY_SOCKET` (nothing happens when it is unset).
pub struct Systemd;

impl Notifier for Systemd {
    fn notify(&self, state: &[NotifyState]) -> std::io::Result<()> {
        sd_notify::notify(state)
    }
}

/// Tells the service manager the server is ready.
pub fn ready(n: &dyn Notifier, status: &str) {
    if let Err(e) = n.notify(&[NotifyState::Ready, NotifyState::Status(status)]) {
        tracing::warn!(error = %e, "cannot notify systemd of readiness");
    }
}

/// Tells the service manager the server is stopping.
pub fn stopping(n: &dyn Notifier) {
    if let Err(e) = n.notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]) {
        tracing::warn!(error = %e, "cannot notify systemd of the stop");
    }
}

/// The watchdog period systemd asked for (`WATCHDOG_USEC`, for this process), if any.
pub fn watchdog_period() -> Option<Duration> {
    sd_notify::watchdog_enabled()
}

/// What the watchdog checks before each ping: `Err(why)` stops the ping.
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Pings every `period / 2` while `check` passes; runs until the returned task is aborted.
pub fn spawn_watchdog(
    period: Duration,
    check: Check,
    notifier: Arc<dyn Notifier>,
) -> tokio::task::JoinHandle<()> {
    let every = (period / 2).max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut withholding = false;
        loop {
            tick.tick().await;
            match check() {
                Ok(()) => {
                    if withholding {
                        tracing::warn!("watchdog: healthy again, pinging systemd");
                        withholding = false;
                    }
                    if let Err(e) = notifier.notify(&[NotifyState::Watchdog]) {
                        tracing::warn!(error = %e, "watchdog: cannot ping systemd");
                    }
                }
                Err(why) => {
                    if !withholding {
                        tracing::error!(
                            reason = %why,
                            "watchdog: not pinging systemd, which will restart the server"
                        );
                        withholding = true;
                    }
                }
            }
        }
    })
}

/// The standard check: no instance of any ready model has been in one execution for longer
/// than `limit`.
pub fn registry_check(registry: Arc<crate::models::Registry>, limit: Duration) -> Check {
    Arc::new(move || {
        match registry.longest_execution() {
        Some((model, version, took)) if took > limit => Err(format!(
            "an instance of model '{model}' version {version} has been executing one batch for {} s (--instance-stall-secs {})",
            took.as_secs(),
            limit.as_secs()
        )),
        _ => Ok(()),
    }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    /// Records what would have gone to systemd.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Notifier for Recorder {
        fn notify(&self, state: &[NotifyState]) -> std::io::Result<()> {
            let line: Vec<String> = state.iter().map(|s| s.to_string()).collect();
            self.0.lock().unwrap().push(line.join("\n"));
            Ok(())
        }
    }

    impl Recorder {
        fn pings(&self) -> usize {
            self.0
                .lock()
                .unwrap()
                .iter()
                .filter(|m| *m == "WATCHDOG=1")
                .count()
        }
    }

    #[tokio::test]
    async fn pings_only_while_healthy() {
        let recorder = Arc::new(Recorder::default());
        let stuck = Arc::new(AtomicBool::new(false));
        let flag = stuck.clone();
        // A 100 ms watchdog: a ping every 50 ms while healthy.
        let task = spawn_watchdog(
            Duration::from_millis(100),
            Arc::new(move || {
                if flag.load(Ordering::SeqCst) {
                    Err("stuck".into())
                } else {
                    Ok(())
                }
            }),
            recorder.clone(),
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        let healthy = recorder.pings();
        assert!(healthy >= 4, "a ping every 50 ms: {healthy} in 400 ms");
        stuck.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(60)).await;
        let at_stuck = recorder.pings();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            recorder.pings(),
            at_stuck,
            "no pings while an instance is stuck"
        );
        stuck.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(recorder.pings() >= at_stuck + 2, "pings resume");
        task.abort();
    }

    #[test]
    fn ready_and_stopping_messages() {
        let r = Recorder::default();
        ready(&r, "serving 3 models");
        stopping(&r);
        let sent = r.0.lock().unwrap().clone();
        assert_eq!(
            sent,
            vec![
                "READY=1\nSTATUS=serving 3 models",
                "STOPPING=1\nSTATUS=stopping"
            ]
        );
    }
}

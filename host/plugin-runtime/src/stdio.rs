//! A plugin's stdout/stderr: written to the server log line by line, and the last few KiB kept
//! so that a trap's error can quote what the plugin printed (a Rust panic message, say).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// Bytes of recent output kept per instance.
const TAIL: usize = 4096;
/// Longest line written to the log.
const MAX_LINE: usize = 2048;

#[derive(Default)]
struct Inner {
    partial: Vec<u8>,
    tail: Vec<u8>,
}

/// One instance's output stream (stdout and stderr share it).
#[derive(Clone)]
pub struct PluginOutput {
    model: Arc<str>,
    inner: Arc<Mutex<Inner>>,
}

impl PluginOutput {
    /// A stream logging under `model`'s name.
    pub fn new(model: &str) -> Self {
        PluginOutput {
            model: model.into(),
            inner: Arc::default(),
        }
    }

    /// The last output, trimmed, lossily decoded (empty when there was none).
    pub fn tail(&self) -> String {
        let inner = self.inner.lock().expect("output lock");
        let mut all = inner.tail.clone();
        all.extend_from_slice(&inner.partial);
        String::from_utf8_lossy(&all).trim().to_string()
    }

    /// Forgets earlier output (called before each call, so a trap quotes only its own).
    pub fn clear(&self) {
        let mut inner = self.inner.lock().expect("output lock");
        inner.tail.clear();
    }

    fn push(&self, bytes: &[u8]) {
        let mut inner = self.inner.lock().expect("output lock");
        inner.partial.extend_from_slice(bytes);
        while let Some(pos) = inner.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = inner.partial.drain(..=pos).collect();
            let text = String::from_utf8_lossy(&line[..line.len().min(MAX_LINE)]);
            tracing::info!(target: "wisp::plugin", model = %self.model, "{}", text.trim_end());
            inner.tail.extend_from_slice(&line);
        }
        if inner.partial.len() > MAX_LINE {
            let line = std::mem::take(&mut inner.partial);
            tracing::info!(target: "wisp::plugin", model = %self.model, "{}", String::from_utf8_lossy(&line[..MAX_LINE]));
            inner.tail.extend_from_slice(&line);
        }
        let excess = inner.tail.len().saturating_sub(TAIL);
        inner.tail.drain(..excess);
    }
}

impl IsTerminal for PluginOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for PluginOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        // Only WASIp3 guests use the async form, and the host links WASIp2 alone.
        StdoutStream::async_stream(&std::io::empty())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for PluginOutput {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for PluginOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 * 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_bounded_tail_of_lines() {
        let out = PluginOutput::new("m");
        out.push(b"first line\nsecond ");
        out.push(b"half\n");
        assert_eq!(out.tail(), "first line\nsecond half");
        out.clear();
        out.push(&vec![b'x'; 3 * TAIL]);
        out.push(b"\nend\n");
        let tail = out.tail();
        assert!(
            tail.len() <= TAIL && tail.ends_with("end"),
            "{}",
            tail.len()
        );
    }
}

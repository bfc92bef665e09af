//! Wisp in-process from `wisp serve`'s settings: [`open`] checks them as the server does and
//! returns an [`Embedded`] (`wisp_service::embed`) on the models they describe, with no
//! listeners. Settings that only concern listeners (ports, TLS, connection limits) are
//! ignored.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use wisp_core::Tensor;
//! use wisp_server::settings::Settings;
//!
//! let wisp = wisp_server::embed::open(Settings::for_repository("model_repo")).await?;
//! let a = Tensor::from_values("INPUT0", vec![1, 16], &[1.0f32; 16])?;
//! let b = Tensor::from_values("INPUT1", vec![1, 16], &[2.0f32; 16])?;
//! let outputs = wisp.infer("add_sub", None, vec![a, b]).await?;
//! assert_eq!(outputs[0].values::<f32>()?, vec![3.0; 16]);
//! wisp.shutdown().await?;
//! # Ok(()) }
//! ```

pub use wisp_service::embed::Embedded;

use crate::settings::Settings;

/// Checks `settings` (reporting every error at once), loads the repository's models and
/// starts the repository poller (poll mode) and the SLA watch.
pub async fn open(settings: Settings) -> anyhow::Result<Embedded> {
    let (core, _, _) = crate::open_core(&settings).await?;
    Ok(Embedded::from_core(core))
}

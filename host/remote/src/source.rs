//! A mirror as the service's [`RepositorySource`]: failures are logged, and what was mirrored
//! serves.

use std::future::Future;
use std::pin::Pin;

use wisp_service::RepositorySource;

use crate::RemoteRepo;

impl RepositorySource for RemoteRepo {
    /// A failure is logged and the mirrored copy loads.
    fn sync_model<'a>(&'a self, model: &'a str) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            if let Err(e) = RemoteRepo::sync_model(self, model).await {
                tracing::error!(model, error = %e, "object-store repository sync failed; loading what was mirrored");
            }
        })
    }

    /// A failure is logged and the registry polls what was mirrored.
    fn sync_all(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Err(e) = self.sync().await {
                tracing::error!(error = %e, "object-store repository sync failed; serving what was mirrored");
            }
        })
    }
}

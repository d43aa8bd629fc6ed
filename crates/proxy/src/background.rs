//! A thread of its own with a current-thread runtime, for a generation's
//! background tasks (health checks, name resolution): they hold only weak
//! references to the pools, so the thread ends with them.

use std::future::Future;

/// Runs `tasks` on a new thread named `name` until every one has ended.
pub(crate) fn run<F>(name: &str, tasks: Vec<F>) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let what = name.to_string();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("{what}: cannot start its runtime: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                let handles: Vec<_> = tasks.into_iter().map(tokio::spawn).collect();
                for h in handles {
                    let _ = h.await;
                }
            });
        })?;
    Ok(())
}

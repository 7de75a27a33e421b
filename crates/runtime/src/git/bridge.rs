//! A loopback TCP door into a sandbox's egress proxy, for the host's git while it updates a
//! mirror: git speaks to an HTTP proxy over TCP, and the proxy serves the sandbox on a Unix
//! socket that only the sandbox can reach. The door lives for one cache operation. Whoever on
//! the host connects meanwhile gets what the sandbox's policy allows, which the host's own
//! network already allows, and cannot use the credential without its placeholder, which lives
//! only in the sandbox, the daemon and the (root-owned) git process's environment.

use std::net::SocketAddr;

use airlock_egress::{ConnectionInfo, Proxy};
use tokio::net::TcpListener;

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("cannot open the loopback door to the egress proxy")]
    Listen(#[source] std::io::Error),
    #[error("cannot start the thread of the loopback door to the egress proxy")]
    Thread(#[source] std::io::Error),
}

/// Serves `proxy` on `127.0.0.1:<free port>` until dropped.
#[derive(Debug)]
pub struct ProxyBridge {
    address: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

async fn accept(listener: TcpListener, proxy: Proxy, stop: tokio::sync::oneshot::Receiver<()>) {
    let serve = async {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            };
            let proxy = proxy.clone();
            tokio::spawn(async move {
                let info = ConnectionInfo {
                    pid: None,
                    exe: Some("git (the host's repository cache)".to_owned()),
                };
                proxy.serve_connection(stream, info).await;
            });
        }
    };
    tokio::select! {
        () = serve => {}
        _ = stop => {}
    }
}

impl ProxyBridge {
    /// With `runtime`, the door runs on it; otherwise on a thread of its own.
    pub fn start(
        proxy: Proxy,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Result<ProxyBridge, BridgeError> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(BridgeError::Listen)?;
        let address = listener.local_addr().map_err(BridgeError::Listen)?;
        listener
            .set_nonblocking(true)
            .map_err(BridgeError::Listen)?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        if let Some(handle) = runtime {
            let _guard = handle.enter();
            let listener = TcpListener::from_std(listener).map_err(BridgeError::Listen)?;
            handle.spawn(accept(listener, proxy, stopped));
            return Ok(ProxyBridge {
                address,
                stop: Some(stop),
                thread: None,
            });
        }
        let thread = std::thread::Builder::new()
            .name("git-proxy-door".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async move {
                    if let Ok(listener) = TcpListener::from_std(listener) {
                        accept(listener, proxy, stopped).await;
                    }
                });
            })
            .map_err(BridgeError::Thread)?;
        Ok(ProxyBridge {
            address,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>`, for git's `http.proxy`.
    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.address)
    }
}

impl Drop for ProxyBridge {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

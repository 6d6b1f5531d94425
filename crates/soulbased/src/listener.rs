//! Accepting TCP connections: every socket the HTTP listener (plain and TLS)
//! accepts goes through [`accept`], which tunes it before anything is served.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// Accepts one connection from `listener` and sets `TCP_NODELAY` on it: a
/// response is several small writes (headers, body chunks, SSE events) and with
/// Nagle each waits for the peer's delayed ACK (~40 ms per call on a busy MCP
/// connection). Accept errors (out of file descriptors and the like) are logged
/// and retried after a short pause, so this only returns a connection.
pub async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                }
                return (tcp, peer);
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A plaintext `axum::serve` listener whose connections come from [`accept`].
pub struct TunedListener(pub TcpListener);

impl axum::serve::Listener for TunedListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        accept(&self.0).await
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The socket the server serves on has TCP_NODELAY set, whatever the default.
    #[tokio::test]
    async fn accepted_sockets_have_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        // The kernel default is Nagle on: the accepted socket starts without it.
        assert!(!client.nodelay().unwrap());
        let (server, peer) = accept(&listener).await;
        assert_eq!(peer, client.local_addr().unwrap());
        assert!(server.nodelay().unwrap(), "TCP_NODELAY must be set");
    }

    /// The plaintext listener hands out tuned sockets.
    #[tokio::test]
    async fn tuned_listener_sets_nodelay() {
        use axum::serve::Listener as _;
        let mut listener = TunedListener(TcpListener::bind("127.0.0.1:0").await.unwrap());
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await;
        assert!(server.nodelay().unwrap());
    }
}

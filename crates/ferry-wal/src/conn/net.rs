//! Opening the socket to one host, for both connections (the replication stream and the SQL
//! connection, which tokio-postgres then speaks over it with `connect_raw`), so that both reach
//! the same addresses and fail with the same errors: a name that does not resolve
//! ([`ReaderError::Resolve`], naming the name) apart from an address that refuses
//! ([`ReaderError::Connect`], naming the host, port and address).

use tokio::net::{TcpStream, UnixStream};

use super::config::{ConnectConfig, Host};
use super::error::ReaderError;

/// An open socket to the host of `cfg` (`cfg.host`, `cfg.port`).
pub(crate) enum Socket {
    /// A TCP connection, with the host name it was opened for (the TLS server name).
    Tcp(TcpStream, String),
    Unix(UnixStream),
}

/// A TCP connection with `cfg`'s keepalive ([`super::config::Keepalive`]: by default idle
/// connections are probed after a minute, so that a load balancer that drops idle flows keeps
/// them and a peer that vanished without a word is noticed) and `tcp_user_timeout`.
async fn connect_tcp(
    addr: std::net::SocketAddr,
    cfg: &ConnectConfig,
) -> std::io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    let k = cfg.keepalive;
    let sock = socket2::SockRef::from(&socket);
    // set_tcp_keepalive turns SO_KEEPALIVE on as it sets the timing.
    if !k.on {
        socket.set_keepalive(false)?;
    } else {
        let mut params = socket2::TcpKeepalive::new();
        if let Some(idle) = k.idle {
            params = params.with_time(idle);
        }
        if let Some(interval) = k.interval {
            params = params.with_interval(interval);
        }
        if let Some(count) = k.count {
            params = params.with_retries(count);
        }
        sock.set_tcp_keepalive(&params)?;
    }
    // Set only on Linux: the connection string refuses it elsewhere.
    #[cfg(target_os = "linux")]
    if let Some(t) = cfg.tcp_user_timeout {
        sock.set_tcp_user_timeout(Some(t))?;
    }
    socket.connect(addr).await
}

/// Resolves the host and connects to its addresses in turn (as libpq does with every address
/// a name resolves to); the error is the last address's.
pub(crate) async fn open(cfg: &ConnectConfig) -> Result<Socket, ReaderError> {
    match &cfg.host {
        Host::Unix(dir) => {
            let path = dir.join(format!(".s.PGSQL.{}", cfg.port));
            UnixStream::connect(&path)
                .await
                .map(Socket::Unix)
                .map_err(|source| ReaderError::Connect {
                    server: path.display().to_string(),
                    source,
                })
        }
        Host::Tcp(host) => {
            let addrs: Vec<std::net::SocketAddr> = match cfg.hostaddr {
                // hostaddr: no name lookup; the host still names the server for TLS.
                Some(ip) => vec![std::net::SocketAddr::new(ip, cfg.port)],
                None => tokio::net::lookup_host((host.as_str(), cfg.port))
                    .await
                    .map_err(|source| ReaderError::Resolve {
                        host: host.clone(),
                        source,
                    })?
                    .collect(),
            };
            let mut last = None;
            for addr in &addrs {
                match connect_tcp(*addr, cfg).await {
                    Ok(tcp) => {
                        tcp.set_nodelay(true)
                            .map_err(ReaderError::io("setting TCP_NODELAY"))?;
                        return Ok(Socket::Tcp(tcp, host.clone()));
                    }
                    Err(e) => last = Some((addr, e)),
                }
            }
            let (addr, source) = last.ok_or_else(|| ReaderError::Resolve {
                host: host.clone(),
                source: std::io::Error::other("the name resolves to no address"),
            })?;
            let server = if addr.ip().to_string() == *host {
                cfg.server()
            } else {
                format!("{} ({addr})", cfg.server())
            };
            Err(ReaderError::Connect { server, source })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The socket carries the connection string's keepalive and user timeout, Ferry's defaults
    /// where it sets none.
    #[tokio::test]
    async fn a_connection_carries_its_keepalive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open_with = |params: &str| {
            let cfg =
                ConnectConfig::parse(&format!("postgres://u@127.0.0.1:{port}/d{params}")).unwrap();
            async move {
                match open(&cfg).await.unwrap() {
                    Socket::Tcp(tcp, _) => tcp,
                    Socket::Unix(_) => unreachable!("a TCP host"),
                }
            }
        };
        let tcp = open_with("").await;
        let sock = socket2::SockRef::from(&tcp);
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(60));
        assert_eq!(
            sock.tcp_keepalive_interval().unwrap(),
            Duration::from_secs(10)
        );
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), 6);
        let tcp = open_with(
            "?keepalives_idle=30&keepalives_interval=5&keepalives_count=3&tcp_user_timeout=20000",
        )
        .await;
        let sock = socket2::SockRef::from(&tcp);
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(30));
        assert_eq!(
            sock.tcp_keepalive_interval().unwrap(),
            Duration::from_secs(5)
        );
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), 3);
        assert_eq!(
            sock.tcp_user_timeout().unwrap(),
            Some(Duration::from_secs(20))
        );
        let tcp = open_with("?keepalives=0").await;
        assert!(!socket2::SockRef::from(&tcp).keepalive().unwrap());
    }
}

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

/// A TCP connection with keepalive on (the kernel's idle time, as tokio-postgres sets it by
/// default), so that a peer that vanished without a word is noticed on an idle connection.
async fn connect_tcp(addr: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_keepalive(true)?;
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
                match connect_tcp(*addr).await {
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

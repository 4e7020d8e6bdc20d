//! The rendezvous: every rank sends its payload to the root over TCP and gets every
//! rank's payload back.
//!
//! Wire format (little endian):
//! - hello, rank -> root: `"HALB"`, version u8, 3 zero bytes, secret [32], rank u32,
//!   size u32, payload length u32, payload.
//! - answer, root -> rank: status u8 (0 ok, 1 error); ok: size u32, then per rank a
//!   length u32 and the bytes; error: length u32 and a UTF-8 message.
//!
//! A hello with a wrong magic or secret is refused (the connection is closed and a
//! warning logged) and the root goes on waiting for the job's ranks.

use super::{Secret, sys_err};
use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const HELLO_MAGIC: &[u8; 4] = b"HALB";
const VERSION: u8 = 1;
/// Largest payload one rank may send.
const MAX_PAYLOAD: usize = 16 << 20;
/// How long the root waits for one connection's hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Time the root waits for every rank, and a rank for the answer:
/// `HALO_BOOTSTRAP_TIMEOUT_MS`, default 120 s.
pub fn bootstrap_timeout() -> Duration {
    std::env::var("HALO_BOOTSTRAP_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(Duration::from_secs(120))
}

/// A running rendezvous root.
#[derive(Debug)]
pub struct RendezvousRoot {
    addr: SocketAddr,
    thread: Option<JoinHandle<Result<()>>>,
}

impl RendezvousRoot {
    /// Binds `addr` and starts serving one job on a thread. `size`, if known, is
    /// checked against what the ranks say; otherwise the first hello sets it. It
    /// waits at most `timeout` for every rank.
    pub fn start(
        addr: SocketAddr,
        secret: Secret,
        size: Option<usize>,
        timeout: Duration,
    ) -> Result<RendezvousRoot> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| sys_err(format!("bootstrap root cannot bind {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| sys_err(format!("bootstrap root address: {e}")))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| sys_err(format!("bootstrap root: {e}")))?;
        let thread = std::thread::Builder::new()
            .name("halo-bootstrap-root".into())
            .spawn(move || serve(listener, secret, size, timeout))
            .map_err(|e| sys_err(format!("cannot start the bootstrap root thread: {e}")))?;
        tracing::info!(%local, "bootstrap root listening");
        Ok(RendezvousRoot {
            addr: local,
            thread: Some(thread),
        })
    }

    /// The address ranks connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Lets the root run on its own; it ends when the job is answered or times out.
    pub fn detach(mut self) {
        self.thread.take();
    }

    /// Waits for the root to finish serving the job.
    pub fn join(mut self) -> Result<()> {
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| Error::internal("the bootstrap root thread panicked"))?,
            None => Ok(()),
        }
    }
}

struct Joined {
    stream: TcpStream,
    payload: Vec<u8>,
}

fn read_exact_timeout(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    stream.read_exact(buf)
}

fn read_u32(stream: &mut TcpStream) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    read_exact_timeout(stream, &mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn send_error(stream: &mut TcpStream, msg: &str) {
    let mut out = vec![1u8];
    out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    out.extend_from_slice(msg.as_bytes());
    let _ = stream.write_all(&out);
}

/// A hello that presented the job's secret.
struct Hello {
    stream: TcpStream,
    peer: SocketAddr,
    rank: usize,
    n: usize,
    payload: Vec<u8>,
}

/// Reads one hello; `None` (and a warning) for anything that is not a complete hello
/// with the job's secret.
fn read_hello(mut stream: TcpStream, peer: SocketAddr, secret: &Secret) -> Option<Hello> {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let mut head = [0u8; 4 + 4 + 32 + 12];
    if let Err(e) = read_exact_timeout(&mut stream, &mut head) {
        tracing::warn!(%peer, "refused bootstrap connection: incomplete hello ({e})");
        return None;
    }
    if &head[..4] != HELLO_MAGIC || head[4] != VERSION {
        tracing::warn!(%peer, "refused bootstrap connection: not a HALO hello");
        return None;
    }
    // Compare the secret without an early exit.
    let diff = head[8..40]
        .iter()
        .zip(secret.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if diff != 0 {
        tracing::warn!(%peer, "refused bootstrap connection: wrong job secret");
        return None;
    }
    let rank = u32::from_le_bytes(head[40..44].try_into().expect("4 bytes")) as usize;
    let n = u32::from_le_bytes(head[44..48].try_into().expect("4 bytes")) as usize;
    let len = u32::from_le_bytes(head[48..52].try_into().expect("4 bytes")) as usize;
    if len > MAX_PAYLOAD {
        send_error(
            &mut stream,
            &format!("payload of {len} bytes is larger than {MAX_PAYLOAD}"),
        );
        return None;
    }
    let mut payload = vec![0u8; len];
    if let Err(e) = read_exact_timeout(&mut stream, &mut payload) {
        tracing::warn!(%peer, rank, "refused bootstrap connection: incomplete payload ({e})");
        return None;
    }
    Some(Hello {
        stream,
        peer,
        rank,
        n,
        payload,
    })
}

fn serve(
    listener: TcpListener,
    secret: Secret,
    mut size: Option<usize>,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let (tx, rx) = std::sync::mpsc::channel::<Hello>();
    let mut joined: Vec<Option<Joined>> = Vec::new();
    let mut count = 0usize;
    loop {
        if let Some(n) = size
            && count == n
        {
            break;
        }
        if Instant::now() >= deadline {
            let n = size.unwrap_or(0);
            let missing: Vec<usize> = (0..n)
                .filter(|&r| joined.get(r).is_none_or(|j| j.is_none()))
                .collect();
            let msg = format!(
                "bootstrap timed out after {timeout:?}: ranks {missing:?} of {n} never joined"
            );
            for j in joined.iter_mut().flatten() {
                send_error(&mut j.stream, &msg);
            }
            tracing::warn!("{msg}");
            return Err(Error::Timeout {
                peer: missing.first().copied(),
                step: None,
                waited: timeout,
                message: msg,
            });
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                // Read each hello on its own short-lived thread, so that a slow or
                // hostile connection cannot hold up the job's ranks.
                let tx = tx.clone();
                let spawned = std::thread::Builder::new()
                    .name("halo-bootstrap-hello".into())
                    .spawn(move || {
                        if let Some(h) = read_hello(stream, peer, &secret) {
                            let _ = tx.send(h);
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(%peer, "cannot read a bootstrap hello: {e}");
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(sys_err(format!("bootstrap root accept: {e}"))),
        }
        let Ok(Hello {
            mut stream,
            peer,
            rank,
            n,
            payload,
        }) = rx.recv_timeout(Duration::from_millis(2))
        else {
            continue;
        };
        let expected = *size.get_or_insert(n);
        if n != expected {
            send_error(
                &mut stream,
                &format!(
                    "rank {rank} says the job has {n} ranks, but earlier ranks said {expected}"
                ),
            );
            continue;
        }
        if rank >= n {
            send_error(
                &mut stream,
                &format!("rank {rank} out of range for {n} ranks"),
            );
            continue;
        }
        if joined.len() < n {
            joined.resize_with(n, || None);
        }
        if joined[rank].is_some() {
            send_error(
                &mut stream,
                &format!("rank {rank} joined twice (from {peer})"),
            );
            continue;
        }
        tracing::debug!(%peer, rank, n, "rank joined the bootstrap");
        joined[rank] = Some(Joined { stream, payload });
        count += 1;
    }
    let mut answer = vec![0u8];
    answer.extend_from_slice(&(joined.len() as u32).to_le_bytes());
    for j in joined.iter().flatten() {
        answer.extend_from_slice(&(j.payload.len() as u32).to_le_bytes());
        answer.extend_from_slice(&j.payload);
    }
    for (rank, j) in joined.iter_mut().enumerate() {
        if let Some(j) = j
            && let Err(e) = j.stream.write_all(&answer)
        {
            tracing::warn!(rank, "bootstrap root could not answer: {e}");
        }
    }
    Ok(())
}

/// Joins the job at `root`: sends this rank's payload and returns every rank's, in
/// rank order. Retries the connection until the root is up, within `timeout`.
pub fn exchange(
    root: SocketAddr,
    secret: &Secret,
    rank: usize,
    size: usize,
    payload: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    if rank >= size {
        return Err(Error::invalid_argument(format!(
            "rank {rank} out of range for {size} ranks"
        )));
    }
    if payload.len() > MAX_PAYLOAD {
        return Err(Error::invalid_argument(format!(
            "bootstrap payload of {} bytes is larger than {MAX_PAYLOAD}",
            payload.len()
        )));
    }
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(5);
    let mut stream = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                peer: Some(0),
                step: None,
                waited: timeout,
                message: format!("rank {rank} could not reach the bootstrap root at {root}"),
            });
        }
        match TcpStream::connect_timeout(&root, left.min(Duration::from_secs(5))) {
            Ok(s) => break s,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused | ErrorKind::TimedOut | ErrorKind::WouldBlock
                ) =>
            {
                std::thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(sys_err(format!(
                    "rank {rank} cannot connect to the bootstrap root at {root}: {e}"
                )));
            }
        }
    };
    let _ = stream.set_nodelay(true);
    let mut hello = Vec::with_capacity(52 + payload.len());
    hello.extend_from_slice(HELLO_MAGIC);
    hello.extend_from_slice(&[VERSION, 0, 0, 0]);
    hello.extend_from_slice(secret);
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(size as u32).to_le_bytes());
    hello.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    hello.extend_from_slice(payload);
    stream.write_all(&hello).map_err(|e| {
        sys_err(format!(
            "rank {rank}: sending the bootstrap hello to {root}: {e}"
        ))
    })?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let _ = stream.set_read_timeout(Some(left));
    let io = |e: std::io::Error| -> Error {
        if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
            Error::Timeout {
                peer: None,
                step: None,
                waited: timeout,
                message: format!(
                    "rank {rank}: no answer from the bootstrap root at {root} (other ranks missing?)"
                ),
            }
        } else {
            sys_err(format!(
                "rank {rank}: reading the bootstrap answer from {root}: {e} (wrong secret or root gone?)"
            ))
        }
    };
    let mut status = [0u8; 1];
    stream.read_exact(&mut status).map_err(io)?;
    let n = read_u32(&mut stream).map_err(io)? as usize;
    if status[0] != 0 {
        let mut msg = vec![0u8; n.min(1 << 16)];
        stream.read_exact(&mut msg).map_err(io)?;
        return Err(Error::InvalidUsage {
            peer: None,
            message: format!(
                "bootstrap refused rank {rank}: {}",
                String::from_utf8_lossy(&msg)
            ),
        });
    }
    if n != size {
        return Err(Error::internal(format!(
            "bootstrap answered {n} ranks, expected {size}"
        )));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = read_u32(&mut stream).map_err(io)? as usize;
        if len > MAX_PAYLOAD {
            return Err(Error::internal(format!(
                "bootstrap answer with a payload of {len} bytes"
            )));
        }
        let mut p = vec![0u8; len];
        stream.read_exact(&mut p).map_err(io)?;
        out.push(p);
    }
    Ok(out)
}

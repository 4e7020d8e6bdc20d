//! The rendezvous: every rank sends its payload to the root over TCP and gets every
//! rank's payload back.
//!
//! # Mutual authentication (the secret never goes on the wire)
//! Rank and root prove to each other that they know the job's 32-byte secret with
//! HMAC-SHA256 over nonces from both sides, and nothing else: a process that listens on
//! the root's address without the secret learns nothing about it and gets no card (the
//! rank refuses it before sending one), and a client without it is refused by the root.
//!
//! Wire format (little endian), `cn`/`rn` the rank's and the root's 32-byte random
//! nonces, `H(label, ...)` = HMAC-SHA256 keyed with the secret over the label and the
//! parts:
//! 1. rank -> root: `"HALB"`, version u8 (2), 3 zero bytes, `cn`.
//! 2. root -> rank: `"HALR"`, version u8, 3 zero bytes, `rn`,
//!    `H("halo-bootstrap-root", cn, rn)`. The rank checks it and hangs up if it is wrong.
//! 3. rank -> root: `H("halo-bootstrap-rank", cn, rn, header)`, then the header: rank u32,
//!    size u32, payload length u32; then the payload. The root checks the proof before
//!    it reads the payload.
//! 4. root -> rank, when every rank has joined: status u8 (0 ok, 1 error); ok: size u32,
//!    then per rank a length u32 and the bytes, then `H("halo-bootstrap-answer", cn, rn,
//!    SHA-256 of the answer so far)`, which the rank checks before it uses a byte of it;
//!    error: length u32 and a UTF-8 message.
//!
//! A connection that is not a HALO hello, or does not prove the secret, is refused (a
//! warning is logged; a client that failed the proof is told so) and the root goes on
//! waiting for the job's ranks.

use super::{Secret, sys_err};
use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const HELLO_MAGIC: &[u8; 4] = b"HALB";
const ROOT_MAGIC: &[u8; 4] = b"HALR";
const VERSION: u8 = 2;
const NONCE: usize = 32;
const PROOF: usize = 32;
const ROOT_LABEL: &[u8] = b"halo-bootstrap-root";
const RANK_LABEL: &[u8] = b"halo-bootstrap-rank";
const ANSWER_LABEL: &[u8] = b"halo-bootstrap-answer";

type HmacSha256 = Hmac<Sha256>;

/// `H(label, parts...)`: HMAC-SHA256 keyed with the job's secret.
fn mac(secret: &Secret, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    m.update(label);
    for p in parts {
        m.update(p);
    }
    m
}

fn nonce() -> Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| {
        sys_err(format!(
            "cannot get random bytes for a bootstrap nonce: {e}"
        ))
    })?;
    Ok(n)
}
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
        Self::serve_on(listener, secret, size, timeout)
    }

    /// Starts serving one job on a thread with a listener bound already, like
    /// [`RendezvousRoot::start`]. A launcher that binds the port itself and serves the
    /// root (`halo launch`) leaves no window in which another process can take the port
    /// between choosing and binding it.
    pub fn serve_on(
        listener: TcpListener,
        secret: Secret,
        size: Option<usize>,
        timeout: Duration,
    ) -> Result<RendezvousRoot> {
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
    /// The nonces of its connection (rank's, root's), for the answer's proof.
    nonces: ([u8; NONCE], [u8; NONCE]),
}

fn read_exact_timeout(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    stream.read_exact(buf)
}

fn send_error(stream: &mut TcpStream, msg: &str) {
    let mut out = vec![1u8];
    out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    out.extend_from_slice(msg.as_bytes());
    let _ = stream.write_all(&out);
}

/// A hello that proved the job's secret.
struct Hello {
    stream: TcpStream,
    peer: SocketAddr,
    rank: usize,
    n: usize,
    payload: Vec<u8>,
    nonces: ([u8; NONCE], [u8; NONCE]),
}

/// Runs the root's side of the handshake on one connection; `None` (and a warning)
/// for anything that is not a complete hello proving the job's secret.
fn read_hello(mut stream: TcpStream, peer: SocketAddr, secret: &Secret) -> Option<Hello> {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(HELLO_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let mut hello = [0u8; 8 + NONCE];
    if let Err(e) = read_exact_timeout(&mut stream, &mut hello) {
        tracing::warn!(%peer, "refused bootstrap connection: incomplete hello ({e})");
        return None;
    }
    if &hello[..4] != HELLO_MAGIC {
        tracing::warn!(%peer, "refused bootstrap connection: not a HALO hello");
        return None;
    }
    if hello[4] != VERSION {
        tracing::warn!(
            %peer,
            "refused bootstrap connection: HALO bootstrap version {} (this root speaks {VERSION})",
            hello[4]
        );
        send_error(
            &mut stream,
            &format!(
                "bootstrap version {} is not this root's ({VERSION}): mixed HALO versions",
                hello[4]
            ),
        );
        return None;
    }
    let cn: [u8; NONCE] = hello[8..].try_into().expect("32 bytes");
    let rn = match nonce() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(%peer, "refused bootstrap connection: {e}");
            return None;
        }
    };
    let mut challenge = Vec::with_capacity(8 + NONCE + PROOF);
    challenge.extend_from_slice(ROOT_MAGIC);
    challenge.extend_from_slice(&[VERSION, 0, 0, 0]);
    challenge.extend_from_slice(&rn);
    challenge.extend_from_slice(&mac(secret, ROOT_LABEL, &[&cn, &rn]).finalize().into_bytes());
    if let Err(e) = stream.write_all(&challenge) {
        tracing::warn!(%peer, "bootstrap connection closed during the handshake ({e})");
        return None;
    }
    let mut head = [0u8; PROOF + 12];
    if let Err(e) = read_exact_timeout(&mut stream, &mut head) {
        tracing::warn!(%peer, "refused bootstrap connection: no proof of the job secret ({e})");
        return None;
    }
    let (proof, header) = head.split_at(PROOF);
    if mac(secret, RANK_LABEL, &[&cn, &rn, header])
        .verify_slice(proof)
        .is_err()
    {
        tracing::warn!(%peer, "refused bootstrap connection: it does not know the job secret");
        send_error(
            &mut stream,
            "the root refused this rank: it does not know the job's secret (HALO_SECRET or the unique id differ)",
        );
        return None;
    }
    let rank = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
    let n = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
    let len = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes")) as usize;
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
        nonces: (cn, rn),
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
            nonces,
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
        joined[rank] = Some(Joined {
            stream,
            payload,
            nonces,
        });
        count += 1;
    }
    let mut answer = vec![0u8];
    answer.extend_from_slice(&(joined.len() as u32).to_le_bytes());
    for j in joined.iter().flatten() {
        answer.extend_from_slice(&(j.payload.len() as u32).to_le_bytes());
        answer.extend_from_slice(&j.payload);
    }
    let digest = Sha256::digest(&answer);
    for (rank, j) in joined.iter_mut().enumerate() {
        let Some(j) = j else { continue };
        let (cn, rn) = &j.nonces;
        let proof = mac(&secret, ANSWER_LABEL, &[cn, rn, &digest])
            .finalize()
            .into_bytes();
        if let Err(e) = j
            .stream
            .write_all(&answer)
            .and_then(|()| j.stream.write_all(&proof))
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
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let _ = stream.set_read_timeout(Some(left));
    let _ = stream.set_write_timeout(Some(left));
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
                "rank {rank}: reading the bootstrap answer from {root}: {e} (root gone?)"
            ))
        }
    };

    // 1-2: this rank's nonce; the root proves it knows the secret, before anything
    // else is sent.
    let cn = nonce()?;
    let mut hello = Vec::with_capacity(8 + NONCE);
    hello.extend_from_slice(HELLO_MAGIC);
    hello.extend_from_slice(&[VERSION, 0, 0, 0]);
    hello.extend_from_slice(&cn);
    stream.write_all(&hello).map_err(|e| {
        sys_err(format!(
            "rank {rank}: sending the bootstrap hello to {root}: {e}"
        ))
    })?;
    let mut challenge = [0u8; 8 + NONCE + PROOF];
    if let Err(e) = stream.read_exact(&mut challenge) {
        return Err(match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => io(e),
            _ => sys_err(format!(
                "rank {rank}: the bootstrap root at {root} closed the connection before proving \
                 that it knows the job's secret ({e}); nothing was sent to it"
            )),
        });
    }
    if &challenge[..4] != ROOT_MAGIC || challenge[4] != VERSION {
        return Err(sys_err(format!(
            "rank {rank}: {root} did not answer as a HALO bootstrap root (version {VERSION}): \
             another program may be listening there; nothing was sent to it"
        )));
    }
    let rn: [u8; NONCE] = challenge[8..8 + NONCE].try_into().expect("32 bytes");
    if mac(secret, ROOT_LABEL, &[&cn, &rn])
        .verify_slice(&challenge[8 + NONCE..])
        .is_err()
    {
        return Err(sys_err(format!(
            "rank {rank}: the bootstrap root at {root} did not prove that it knows the job's \
             secret (another process listening on that address, or a different HALO_SECRET / \
             unique id); this rank's card was not sent"
        )));
    }
    // 3: this rank's proof, header and payload.
    let mut header = [0u8; 12];
    header[0..4].copy_from_slice(&(rank as u32).to_le_bytes());
    header[4..8].copy_from_slice(&(size as u32).to_le_bytes());
    header[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let mut msg = Vec::with_capacity(PROOF + 12 + payload.len());
    msg.extend_from_slice(
        &mac(secret, RANK_LABEL, &[&cn, &rn, &header])
            .finalize()
            .into_bytes(),
    );
    msg.extend_from_slice(&header);
    msg.extend_from_slice(payload);
    stream.write_all(&msg).map_err(|e| {
        sys_err(format!(
            "rank {rank}: sending the bootstrap hello to {root}: {e}"
        ))
    })?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let _ = stream.set_read_timeout(Some(left));
    // 4: the answer, hashed as it is read, and its proof.
    let mut digest = Sha256::new();
    let mut read = |stream: &mut TcpStream, buf: &mut [u8]| -> Result<()> {
        stream.read_exact(buf).map_err(io)?;
        digest.update(&*buf);
        Ok(())
    };
    let mut status = [0u8; 1];
    read(&mut stream, &mut status)?;
    let mut word = [0u8; 4];
    read(&mut stream, &mut word)?;
    let n = u32::from_le_bytes(word) as usize;
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
        read(&mut stream, &mut word)?;
        let len = u32::from_le_bytes(word) as usize;
        if len > MAX_PAYLOAD {
            return Err(Error::internal(format!(
                "bootstrap answer with a payload of {len} bytes"
            )));
        }
        let mut p = vec![0u8; len];
        read(&mut stream, &mut p)?;
        out.push(p);
    }
    let mut proof = [0u8; PROOF];
    stream.read_exact(&mut proof).map_err(io)?;
    if mac(secret, ANSWER_LABEL, &[&cn, &rn, &digest.finalize()])
        .verify_slice(&proof)
        .is_err()
    {
        return Err(sys_err(format!(
            "rank {rank}: the bootstrap answer from {root} does not carry the job's proof \
             (altered on the way?); it was not used"
        )));
    }
    Ok(out)
}

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
//! warning is logged, the first few one by one; a client that failed the proof is told
//! so) and the root goes on waiting for the job's ranks. The root serves every
//! connection from its one thread (`root.rs`: nonblocking sockets and `poll`), holds at
//! most [`MAX_PENDING`] that have not proved the secret (the oldest is closed when
//! another arrives) and closes each that has not within `HELLO_TIMEOUT` (5 s) of its
//! accept. A rank whose connection is closed before the root's challenge (the root
//! shedding load) connects again, within its timeout.

use super::wire::{
    ANSWER_LABEL, HELLO_MAGIC, MAX_PAYLOAD, NONCE, PROOF, RANK_LABEL, ROOT_LABEL, ROOT_MAGIC,
    VERSION, mac, nonce,
};
use super::{Secret, sys_err};
use crate::error::{Error, Result};
use hmac::Mac;
use sha2::{Digest, Sha256};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

pub use super::root::MAX_PENDING;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Time the root waits for every rank, and a rank for the answer:
/// `HALO_BOOTSTRAP_TIMEOUT_MS`, default 120 s.
pub fn bootstrap_timeout() -> Duration {
    // A malformed value is refused where the communicator's configuration is read
    // (`InitConfig::from_env`); here it is only not taken.
    halo_params::BOOTSTRAP_TIMEOUT_MS
        .number()
        .ok()
        .flatten()
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
            .spawn(move || super::root::serve(listener, secret, size, timeout))
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
    let mut backoff = Duration::from_millis(5);
    // Connections the root closed before its challenge: a root holding its limit of
    // unproved connections closes the oldest (strangers flooding it); connect again.
    let mut shed = 0usize;
    let (mut stream, cn, challenge) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                peer: Some(0),
                step: None,
                waited: timeout,
                message: if shed == 0 {
                    format!("rank {rank} could not reach the bootstrap root at {root}")
                } else {
                    format!(
                        "rank {rank} could not reach the bootstrap root at {root}: it closed \
                         this rank's connection {shed} times before its challenge (flooded \
                         with connections?)"
                    )
                },
            });
        }
        let retry = |backoff: &mut Duration| {
            std::thread::sleep((*backoff).min(left));
            *backoff = (*backoff * 2).min(Duration::from_millis(200));
        };
        let mut stream = match TcpStream::connect_timeout(&root, left.min(Duration::from_secs(5))) {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused | ErrorKind::TimedOut | ErrorKind::WouldBlock
                ) =>
            {
                retry(&mut backoff);
                continue;
            }
            Err(e) => {
                return Err(sys_err(format!(
                    "rank {rank} cannot connect to the bootstrap root at {root}: {e}"
                )));
            }
        };
        let _ = stream.set_nodelay(true);
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let _ = stream.set_read_timeout(Some(left));
        let _ = stream.set_write_timeout(Some(left));

        // 1-2: this rank's nonce; the root proves it knows the secret, before anything
        // else is sent.
        let cn = nonce()?;
        let mut hello = Vec::with_capacity(8 + NONCE);
        hello.extend_from_slice(HELLO_MAGIC);
        hello.extend_from_slice(&[VERSION, 0, 0, 0]);
        hello.extend_from_slice(&cn);
        let closed = |e: &std::io::Error| {
            matches!(
                e.kind(),
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
            )
        };
        if let Err(e) = stream.write_all(&hello) {
            if closed(&e) {
                shed += 1;
                retry(&mut backoff);
                continue;
            }
            return Err(sys_err(format!(
                "rank {rank}: sending the bootstrap hello to {root}: {e}"
            )));
        }
        let mut challenge = [0u8; 8 + NONCE + PROOF];
        let first = loop {
            match stream.read(&mut challenge) {
                Ok(n) => break Ok(n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if closed(&e) => break Ok(0),
                Err(e) => break Err(e),
            }
        };
        let got = first.and_then(|n| {
            if n == 0 {
                Ok(false)
            } else {
                stream.read_exact(&mut challenge[n..]).map(|()| true)
            }
        });
        match got {
            Ok(true) => break (stream, cn, challenge),
            Ok(false) => {
                shed += 1;
                retry(&mut backoff);
            }
            Err(e) => {
                return Err(match e.kind() {
                    ErrorKind::WouldBlock | ErrorKind::TimedOut => io(e),
                    _ => sys_err(format!(
                        "rank {rank}: the bootstrap root at {root} closed the connection before \
                         proving that it knows the job's secret ({e}); nothing was sent to it"
                    )),
                });
            }
        }
    };
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

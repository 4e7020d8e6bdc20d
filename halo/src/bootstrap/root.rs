//! The rendezvous root's server: one thread, nonblocking sockets and `poll(2)`.
//!
//! Strangers cost the root no thread: every connection is a small state machine
//! ([`Handshake`], bytes in, bytes out, no socket) served from the root's one thread.
//! At most [`MAX_PENDING`] connections that have not yet proved the job's secret are
//! held; when another arrives at the limit, the oldest of them is closed (a job's rank
//! proves the secret one round trip after it connects, an idle stranger never does, so
//! the ranks still get through while strangers keep connecting; a rank whose connection
//! was closed before the root's challenge connects again). Each of those connections
//! has [`HELLO_TIMEOUT`] from its accept to its proof, in total; a rank that proved the
//! secret has `HELLO_TIMEOUT` between any two reads of its payload. Every wait is
//! bounded: `poll` by the nearest of those deadlines and the job's own timeout.

use super::Secret;
use super::wire::{
    ANSWER_LABEL, HELLO_MAGIC, HELLO_TIMEOUT, MAX_PAYLOAD, NONCE, PROOF, RANK_LABEL, ROOT_LABEL,
    ROOT_MAGIC, VERSION, mac, nonce,
};
use crate::error::{Error, Result};
use hmac::Mac as _;
use sha2::{Digest as _, Sha256};
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd as _;
use std::time::{Duration, Instant};

/// Most connections the root holds that have not proved the job's secret (yet); the
/// oldest of them is closed when another arrives.
pub const MAX_PENDING: usize = 256;

/// Connections accepted per turn of the loop, so that a flood of connects does not
/// keep the root from reading the hellos it has.
const ACCEPT_BATCH: usize = 64;

/// Refusals logged as warnings one by one; the rest are counted and summarised.
const WARN_EACH: usize = 16;

/// Where a connection's handshake is.
#[derive(Debug)]
enum Stage {
    /// Waiting for `"HALB"`, version, 3 zero bytes, the rank's nonce.
    Hello,
    /// The challenge went out; waiting for the rank's proof and header.
    Proof,
    /// The proof was right; waiting for `len` payload bytes.
    Payload { rank: usize, n: usize, len: usize },
    /// Done (joined or refused).
    Over,
}

/// What the handshake wants done after a step.
#[derive(Debug)]
pub(super) enum Step {
    /// Send these bytes (the challenge), then read on.
    Send(Vec<u8>),
    /// The rank proved the secret; its payload follows.
    Proved,
    /// A complete hello that proved the job's secret.
    Joined {
        rank: usize,
        n: usize,
        payload: Vec<u8>,
        nonces: ([u8; NONCE], [u8; NONCE]),
    },
    /// Not a hello of this job: why (for the log), and what to tell the peer, if anything.
    Refused { why: String, reply: Option<String> },
}

/// The root's side of one connection's handshake, over bytes: feed it
/// [`Handshake::want`] bytes with [`Handshake::push`], then call [`Handshake::step`].
#[derive(Debug)]
pub(super) struct Handshake {
    stage: Stage,
    buf: Vec<u8>,
    cn: [u8; NONCE],
    rn: [u8; NONCE],
}

impl Handshake {
    /// A handshake whose challenge will carry the root's nonce `rn`.
    pub(super) fn new(rn: [u8; NONCE]) -> Handshake {
        Handshake {
            stage: Stage::Hello,
            buf: Vec::new(),
            cn: [0; NONCE],
            rn,
        }
    }

    /// Bytes still needed before the next [`Handshake::step`] (0: step now).
    pub(super) fn want(&self) -> usize {
        let need = match self.stage {
            Stage::Hello => 8 + NONCE,
            Stage::Proof => PROOF + 12,
            Stage::Payload { len, .. } => len,
            Stage::Over => return 0,
        };
        need.saturating_sub(self.buf.len())
    }

    /// Whether the peer proved the job's secret.
    pub(super) fn proved(&self) -> bool {
        matches!(self.stage, Stage::Payload { .. })
    }

    /// Appends received bytes (at most [`Handshake::want`]).
    pub(super) fn push(&mut self, data: &[u8]) {
        debug_assert!(data.len() <= self.want());
        self.buf.extend_from_slice(data);
    }

    /// Acts on the bytes of the current stage, which are all there.
    pub(super) fn step(&mut self, secret: &Secret) -> Step {
        debug_assert_eq!(self.want(), 0);
        let buf = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.stage, Stage::Over) {
            Stage::Hello => {
                if &buf[..4] != HELLO_MAGIC {
                    return refused("not a HALO hello", None);
                }
                if buf[4] != VERSION {
                    return refused(
                        &format!(
                            "HALO bootstrap version {} (this root speaks {VERSION})",
                            buf[4]
                        ),
                        Some(format!(
                            "bootstrap version {} is not this root's ({VERSION}): mixed HALO versions",
                            buf[4]
                        )),
                    );
                }
                self.cn.copy_from_slice(&buf[8..]);
                let mut challenge = Vec::with_capacity(8 + NONCE + PROOF);
                challenge.extend_from_slice(ROOT_MAGIC);
                challenge.extend_from_slice(&[VERSION, 0, 0, 0]);
                challenge.extend_from_slice(&self.rn);
                challenge.extend_from_slice(
                    &mac(secret, ROOT_LABEL, &[&self.cn, &self.rn])
                        .finalize()
                        .into_bytes(),
                );
                self.stage = Stage::Proof;
                Step::Send(challenge)
            }
            Stage::Proof => {
                let (proof, header) = buf.split_at(PROOF);
                if mac(secret, RANK_LABEL, &[&self.cn, &self.rn, header])
                    .verify_slice(proof)
                    .is_err()
                {
                    return refused(
                        "it does not know the job secret",
                        Some(
                            "the root refused this rank: it does not know the job's secret \
                             (HALO_SECRET, the key file or the unique id differ)"
                                .into(),
                        ),
                    );
                }
                let word = |i: usize| {
                    u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes")) as usize
                };
                let (rank, n, len) = (word(0), word(4), word(8));
                if len > MAX_PAYLOAD {
                    return refused(
                        &format!("rank {rank} announced a payload of {len} bytes"),
                        Some(format!(
                            "payload of {len} bytes is larger than {MAX_PAYLOAD}"
                        )),
                    );
                }
                self.stage = Stage::Payload { rank, n, len };
                Step::Proved
            }
            Stage::Payload { rank, n, .. } => Step::Joined {
                rank,
                n,
                payload: buf,
                nonces: (self.cn, self.rn),
            },
            Stage::Over => refused("the handshake is over", None),
        }
    }
}

fn refused(why: &str, reply: Option<String>) -> Step {
    Step::Refused {
        why: why.to_string(),
        reply,
    }
}

/// Runs the root's handshake over `input` as one connection would send it, with a fixed
/// secret and root nonce; with `forge`, the harness writes a valid proof over the
/// header the input gives (as a rank that knows the secret would), so that the payload
/// stage is reached too. Whether the input joined. For the fuzz targets.
#[doc(hidden)]
pub fn root_handshake_for_fuzzing(input: &[u8], forge: bool) -> bool {
    let secret = [0x42u8; 32];
    let mut h = Handshake::new([0x24; NONCE]);
    let mut input = input.to_vec();
    let mut at = 0usize;
    loop {
        let want = h.want();
        if want > 0 {
            if at >= input.len() {
                return false;
            }
            let take = want.min(input.len() - at);
            if forge && matches!(h.stage, Stage::Proof) && h.buf.is_empty() && take == want {
                let header = input[at + PROOF..at + PROOF + 12].to_vec();
                let proof = mac(&secret, RANK_LABEL, &[&h.cn, &h.rn, &header])
                    .finalize()
                    .into_bytes();
                input[at..at + PROOF].copy_from_slice(&proof);
            }
            h.push(&input[at..at + take]);
            at += take;
            continue;
        }
        match h.step(&secret) {
            Step::Send(b) => assert_eq!(b.len(), 8 + NONCE + PROOF),
            Step::Proved => assert!(h.proved()),
            Step::Joined { payload, n: _, .. } => {
                assert!(payload.len() <= MAX_PAYLOAD);
                return true;
            }
            Step::Refused { .. } => return false,
        }
    }
}

/// One connection the root holds.
struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    shake: Handshake,
    /// Bytes to send before reading on.
    out: Vec<u8>,
    /// When it is closed if it has not moved on.
    deadline: Instant,
}

/// What became of a connection after it was served.
enum Served {
    Keep,
    Close,
    Joined(Step),
}

/// Counts of the connections the root closed, for the log.
#[derive(Default)]
struct Tally {
    warned: usize,
    refused: usize,
    timed_out: usize,
    shed: usize,
    hung_up: usize,
}

impl Tally {
    fn refuse(&mut self, peer: SocketAddr, why: &str) {
        self.refused += 1;
        if self.warned < WARN_EACH {
            self.warned += 1;
            tracing::warn!(%peer, "refused bootstrap connection: {why}");
        } else {
            tracing::debug!(%peer, "refused bootstrap connection: {why}");
        }
    }

    fn summary(&self) {
        if self.refused + self.timed_out + self.shed + self.hung_up > WARN_EACH {
            tracing::warn!(
                refused = self.refused,
                timed_out = self.timed_out,
                shed = self.shed,
                hung_up = self.hung_up,
                "bootstrap root closed connections that did not prove the job's secret \
                 (refused, no hello within {HELLO_TIMEOUT:?}, closed over the limit of \
                 {MAX_PENDING} pending, hung up)"
            );
        }
    }
}

fn write_error(stream: &mut TcpStream, msg: &str) {
    let mut out = vec![1u8];
    out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    out.extend_from_slice(msg.as_bytes());
    let _ = stream.write_all(&out);
}

/// Moves one connection on as far as its socket allows.
fn serve_conn(c: &mut Conn, secret: &Secret, tally: &mut Tally) -> Served {
    let mut buf = [0u8; 64 << 10];
    loop {
        if !c.out.is_empty() {
            match c.stream.write(&c.out) {
                Ok(n) => {
                    c.out.drain(..n);
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Served::Keep,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    tally.hung_up += 1;
                    return Served::Close;
                }
            }
        }
        let want = c.shake.want();
        if want == 0 {
            match c.shake.step(secret) {
                Step::Send(bytes) => c.out = bytes,
                Step::Proved => c.deadline = Instant::now() + HELLO_TIMEOUT,
                joined @ Step::Joined { .. } => return Served::Joined(joined),
                Step::Refused { why, reply } => {
                    tally.refuse(c.peer, &why);
                    if let Some(r) = reply {
                        write_error(&mut c.stream, &r);
                    }
                    return Served::Close;
                }
            }
            continue;
        }
        let take = want.min(buf.len());
        match c.stream.read(&mut buf[..take]) {
            Ok(0) => {
                tally.hung_up += 1;
                if c.shake.proved() {
                    tracing::warn!(peer = %c.peer, "a rank hung up during its bootstrap payload");
                }
                return Served::Close;
            }
            Ok(n) => {
                c.shake.push(&buf[..n]);
                if c.shake.proved() {
                    c.deadline = Instant::now() + HELLO_TIMEOUT;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Served::Keep,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => {
                tally.hung_up += 1;
                return Served::Close;
            }
        }
    }
}

struct Joined {
    stream: TcpStream,
    payload: Vec<u8>,
    /// The nonces of its connection (rank's, root's), for the answer's proof.
    nonces: ([u8; NONCE], [u8; NONCE]),
}

/// Serves one job on `listener` (nonblocking) until every rank has joined and been
/// answered, or `timeout` has passed.
pub(super) fn serve(
    listener: TcpListener,
    secret: Secret,
    mut size: Option<usize>,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut conns: Vec<Conn> = Vec::new();
    let mut joined: Vec<Option<Joined>> = Vec::new();
    let mut count = 0usize;
    let mut tally = Tally::default();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        if let Some(n) = size
            && count == n
        {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            let n = size.unwrap_or(0);
            let missing: Vec<usize> = (0..n)
                .filter(|&r| joined.get(r).is_none_or(|j| j.is_none()))
                .collect();
            let msg = format!(
                "bootstrap timed out after {timeout:?}: ranks {missing:?} of {n} never joined"
            );
            for j in joined.iter_mut().flatten() {
                let _ = j.stream.set_nonblocking(false);
                let _ = j.stream.set_write_timeout(Some(HELLO_TIMEOUT));
                write_error(&mut j.stream, &msg);
            }
            tally.summary();
            tracing::warn!("{msg}");
            return Err(Error::Timeout {
                peer: missing.first().copied(),
                step: None,
                waited: timeout,
                message: msg,
            });
        }
        // Wait for the listener or a held connection, at most until the nearest deadline.
        let until = conns
            .iter()
            .map(|c| c.deadline)
            .fold(deadline, Instant::min);
        let wait_ms = until
            .saturating_duration_since(now)
            .as_millis()
            .clamp(1, 1000) as libc::c_int;
        fds.clear();
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.extend(conns.iter().map(|c| libc::pollfd {
            fd: c.stream.as_raw_fd(),
            events: if c.out.is_empty() {
                libc::POLLIN
            } else {
                libc::POLLOUT
            },
            revents: 0,
        }));
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds, each naming a descriptor
        // this function owns (the listener, the held streams) for the whole call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(super::sys_err(format!("bootstrap root poll: {e}")));
            }
            continue;
        }
        // The held connections that have something to read (or room to write), then the
        // new ones (a rank's hello is often there already).
        let ready: Vec<bool> = fds[1..].iter().map(|p| p.revents != 0).collect();
        let mut next = Vec::with_capacity(conns.len());
        let mut done: Vec<(Conn, Step)> = Vec::new();
        for (mut c, ready) in conns.drain(..).zip(ready) {
            if !ready {
                next.push(c);
                continue;
            }
            match serve_conn(&mut c, &secret, &mut tally) {
                Served::Keep => next.push(c),
                Served::Close => {}
                Served::Joined(step) => done.push((c, step)),
            }
        }
        conns = next;
        if fds[0].revents != 0 {
            for _ in 0..ACCEPT_BATCH {
                let (stream, peer) = match listener.accept() {
                    Ok(a) => a,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::Interrupted
                                | ErrorKind::ConnectionAborted
                                | ErrorKind::ConnectionReset
                        ) =>
                    {
                        continue;
                    }
                    Err(e) => {
                        // Out of descriptors or memory: the connections held are closed
                        // by their deadlines; try again on the next turn.
                        tracing::warn!("bootstrap root accept: {e}");
                        break;
                    }
                };
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let pending = conns.iter().filter(|c| !c.shake.proved()).count();
                if pending >= MAX_PENDING
                    && let Some(oldest) = conns.iter().position(|c| !c.shake.proved())
                {
                    let old = conns.remove(oldest);
                    tally.shed += 1;
                    tracing::debug!(peer = %old.peer, "bootstrap root: closed the oldest pending connection (limit {MAX_PENDING})");
                }
                let rn = match nonce() {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::warn!(%peer, "refused bootstrap connection: {e}");
                        continue;
                    }
                };
                let mut c = Conn {
                    stream,
                    peer,
                    shake: Handshake::new(rn),
                    out: Vec::new(),
                    deadline: Instant::now() + HELLO_TIMEOUT,
                };
                match serve_conn(&mut c, &secret, &mut tally) {
                    Served::Keep => conns.push(c),
                    Served::Close => {}
                    Served::Joined(step) => done.push((c, step)),
                }
            }
        }
        // Connections past their deadline.
        let now = Instant::now();
        conns.retain(|c| {
            let keep = c.deadline > now;
            if !keep {
                if c.shake.proved() {
                    tracing::warn!(peer = %c.peer, "a rank's bootstrap payload stalled for {HELLO_TIMEOUT:?}");
                } else {
                    tally.timed_out += 1;
                    tracing::debug!(peer = %c.peer, "bootstrap connection closed: no proof of the job's secret within {HELLO_TIMEOUT:?}");
                }
            }
            keep
        });
        for (c, step) in done {
            let Step::Joined {
                rank,
                n,
                payload,
                nonces,
            } = step
            else {
                continue;
            };
            let Conn {
                mut stream, peer, ..
            } = c;
            let expected = *size.get_or_insert(n);
            if n != expected {
                write_error(
                    &mut stream,
                    &format!(
                        "rank {rank} says the job has {n} ranks, but earlier ranks said {expected}"
                    ),
                );
                continue;
            }
            if rank >= n {
                write_error(
                    &mut stream,
                    &format!("rank {rank} out of range for {n} ranks"),
                );
                continue;
            }
            if joined.len() < n {
                joined.resize_with(n, || None);
            }
            if joined[rank].is_some() {
                write_error(
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
    }
    drop(conns);
    tally.summary();
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
        let _ = j.stream.set_nonblocking(false);
        let _ = j.stream.set_write_timeout(Some(HELLO_TIMEOUT));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(cn: [u8; NONCE]) -> Vec<u8> {
        let mut h = HELLO_MAGIC.to_vec();
        h.extend_from_slice(&[VERSION, 0, 0, 0]);
        h.extend_from_slice(&cn);
        h
    }

    #[test]
    fn a_hello_that_proves_the_secret_joins_byte_by_byte() {
        let secret = [9u8; 32];
        let (cn, rn) = ([1u8; NONCE], [2u8; NONCE]);
        let mut h = Handshake::new(rn);
        for b in hello(cn) {
            h.push(&[b]);
        }
        let Step::Send(challenge) = h.step(&secret) else {
            panic!("no challenge")
        };
        assert_eq!(&challenge[..4], ROOT_MAGIC);
        let mut header = Vec::new();
        for w in [1u32, 2, 3] {
            header.extend_from_slice(&w.to_le_bytes());
        }
        let proof = mac(&secret, RANK_LABEL, &[&cn, &rn, &header])
            .finalize()
            .into_bytes();
        h.push(&proof);
        h.push(&header);
        assert!(matches!(h.step(&secret), Step::Proved));
        assert_eq!(h.want(), 3);
        h.push(b"abc");
        match h.step(&secret) {
            Step::Joined {
                rank, n, payload, ..
            } => assert_eq!((rank, n, payload), (1, 2, b"abc".to_vec())),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_wrong_proof_or_magic_is_refused() {
        let secret = [9u8; 32];
        let mut h = Handshake::new([2; NONCE]);
        h.push(&hello([1; NONCE]));
        assert!(matches!(h.step(&secret), Step::Send(_)));
        h.push(&[0u8; PROOF + 12]);
        assert!(matches!(
            h.step(&secret),
            Step::Refused { reply: Some(_), .. }
        ));
        let mut h = Handshake::new([2; NONCE]);
        h.push(&[b'G'; 8 + NONCE]);
        assert!(matches!(h.step(&secret), Step::Refused { reply: None, .. }));
        assert!(!root_handshake_for_fuzzing(&[0; 100], false));
        let mut forged = hello([1; NONCE]);
        forged.extend_from_slice(&[0u8; PROOF]);
        for w in [0u32, 1, 2] {
            forged.extend_from_slice(&w.to_le_bytes());
        }
        forged.extend_from_slice(b"hi");
        assert!(root_handshake_for_fuzzing(&forged, true));
        assert!(!root_handshake_for_fuzzing(&forged, false));
    }
}

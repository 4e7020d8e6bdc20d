//! The 1F1B schedule of one stage, and the stage-to-stage exchanges on the PP
//! communicator (Megatron's names and pairing).
//!
//! Stage `s` of `PP` runs `min(PP - s - 1, M)` warm-up forwards, then alternates one
//! forward and one backward, then the remaining backwards. In the steady state a stage
//! sends its forward output and receives the next backward gradient in one
//! [`Communicator::send_recv`] (and the other way round), so with blocking, rendezvous
//! point-to-point every send meets a receive that is already posted.

use std::cell::RefCell;
use std::ops::Range;
use std::time::{Duration, Instant};

use halo::Communicator;

use super::compute::{Footprint, StageCompute};
use super::mesh::Mesh;
use super::moe_layer::{self, LayerTape};
use super::placement::Placement;
use super::{ActivationPeak, StepTimes};
use crate::error::Result;

/// One micro-batch of this rank's data.
#[derive(Debug, Clone, Copy)]
pub(super) struct MicroBatch<'a> {
    pub(super) tokens: &'a [u32],
    pub(super) targets: &'a [u32],
}

/// What the schedule needs to know about this rank's stage.
#[derive(Debug)]
pub(super) struct Stage {
    pub(super) layers: Range<usize>,
    /// The expert -> rank table in force for this step.
    pub(super) placement: Placement,
    /// This rank's EP index.
    pub(super) ep_index: usize,
    pub(super) hidden: usize,
    /// Token rows per micro-batch on this rank.
    pub(super) rows: usize,
    pub(super) normaliser: f32,
    /// Slots this rank's routers sent to each expert this step, `layer * E + expert`.
    pub(super) routed: RefCell<Vec<u64>>,
    /// Overlap each local expert's compute with the next expert's dispatch and the
    /// previous one's combine ([`super::Executor::set_overlap`]).
    pub(super) overlap: bool,
    /// How the forward dispatch moves the tokens ([`super::Executor::set_dispatch`]).
    pub(super) dispatch: halo::MoeDispatch,
}

impl Stage {
    /// This rank's experts of block `layer`, ascending.
    pub(super) fn local(&self, layer: usize) -> Vec<usize> {
        self.placement.local(layer, self.ep_index)
    }

    /// Adds one routing's per-expert counts of block `layer` to [`Stage::routed`].
    pub(super) fn record(&self, layer: usize, counts: &[usize]) {
        let e = counts.len();
        let mut routed = self.routed.borrow_mut();
        if let Some(row) = routed.get_mut(layer * e..(layer + 1) * e) {
            for (r, &c) in row.iter_mut().zip(counts) {
                *r += c as u64;
            }
        }
    }
}

/// Saved state of one micro-batch's forward on this stage.
struct Tape<C: StageCompute> {
    layers: Vec<LayerTape<C>>,
    head: Option<C::HeadState>,
}

impl<C: StageCompute> Tape<C> {
    /// Bytes kept: (experts' saved states, everything else).
    fn bytes(&self) -> (usize, usize) {
        let head = self.head.as_ref().map_or(0, Footprint::bytes);
        self.layers
            .iter()
            .map(LayerTape::bytes)
            .fold((0, head), |(e, r), (e2, r2)| (e + e2, r + r2))
    }
}

/// A stored tape and its bytes (experts, everything else).
type Held<C> = (Tape<C>, (usize, usize));

/// The saved forward states of the micro-batches in flight, with the peak of their bytes.
struct Tapes<C: StageCompute> {
    held: Vec<Option<Held<C>>>,
    live: (usize, usize),
    peak: ActivationPeak,
}

impl<C: StageCompute> Tapes<C> {
    fn new(m: usize) -> Self {
        Tapes {
            held: (0..m).map(|_| None).collect(),
            live: (0, 0),
            peak: ActivationPeak::default(),
        }
    }

    fn put(&mut self, m: usize, tape: Tape<C>) {
        let b = tape.bytes();
        self.live = (self.live.0 + b.0, self.live.1 + b.1);
        self.held[m] = Some((tape, b));
        let in_flight = self.held.iter().flatten().count();
        let total = self.live.0 + self.live.1;
        if total > self.peak.bytes {
            self.peak = ActivationPeak {
                bytes: total,
                expert_bytes: self.live.0,
                in_flight,
            };
        }
    }

    fn take(&mut self, m: usize) -> Result<Tape<C>> {
        let (tape, b) = self.held[m].take().ok_or_else(|| missing_tape(m))?;
        self.live = (self.live.0 - b.0, self.live.1 - b.1);
        Ok(tape)
    }
}

/// Times of the point-to-point calls, by kind (one message, or a send and a receive
/// together), to split them into transfer and waiting.
///
/// The fastest call of a kind in the step is taken as that kind's transfer time (its
/// peer was ready); whatever a call takes beyond it is waiting for the neighbour stage:
/// the pipeline bubble ([`StepTimes::idle`]).
#[derive(Default)]
struct P2pClock {
    single: Vec<Duration>,
    pair: Vec<Duration>,
}

impl P2pClock {
    fn time<T>(list: &mut Vec<Duration>, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let out = f();
        list.push(t0.elapsed());
        out
    }

    fn single<T>(&mut self, f: impl FnOnce() -> T) -> T {
        Self::time(&mut self.single, f)
    }

    fn pair<T>(&mut self, f: impl FnOnce() -> T) -> T {
        Self::time(&mut self.pair, f)
    }

    /// Adds the transfer part to `times.p2p` and the waiting to `times.idle`.
    fn settle(&self, times: &mut StepTimes) {
        for list in [&self.single, &self.pair] {
            let Some(&min) = list.iter().min() else {
                continue;
            };
            let total: Duration = list.iter().sum();
            let transfer = min * list.len() as u32;
            times.p2p += transfer;
            times.idle += total - transfer;
        }
    }
}

// ---- stage-to-stage exchanges (the only point-to-point calls of the executor) ----

fn recv_forward(pp: &mut Communicator, len: usize) -> Result<Vec<f32>> {
    let mut x = vec![0.0f32; len];
    let prev = pp.rank() - 1;
    pp.recv(&mut x, prev)?;
    Ok(x)
}

fn send_forward(pp: &mut Communicator, y: &[f32]) -> Result<()> {
    let next = pp.rank() + 1;
    Ok(pp.send(y, next)?)
}

fn recv_backward(pp: &mut Communicator, len: usize) -> Result<Vec<f32>> {
    let mut dy = vec![0.0f32; len];
    let next = pp.rank() + 1;
    pp.recv(&mut dy, next)?;
    Ok(dy)
}

fn send_backward(pp: &mut Communicator, dx: &[f32]) -> Result<()> {
    let prev = pp.rank() - 1;
    Ok(pp.send(dx, prev)?)
}

fn send_forward_recv_backward(pp: &mut Communicator, y: &[f32]) -> Result<Vec<f32>> {
    let mut dy = vec![0.0f32; y.len()];
    let next = pp.rank() + 1;
    pp.send_recv(y, next, &mut dy, next)?;
    Ok(dy)
}

fn send_backward_recv_forward(pp: &mut Communicator, dx: &[f32]) -> Result<Vec<f32>> {
    let mut x = vec![0.0f32; dx.len()];
    let prev = pp.rank() - 1;
    pp.send_recv(dx, prev, &mut x, prev)?;
    Ok(x)
}

// ---- one micro-batch through this stage ----

/// Forward of micro-batch `mb` on this stage: `x` is the previous stage's output (`None`
/// on the first stage, which embeds). Returns the output for the next stage (`None` on
/// the last, which computes the loss) and the loss of these rows.
fn forward<C: StageCompute>(
    mesh: &mut Mesh,
    st: &Stage,
    model: &C,
    mb: MicroBatch<'_>,
    x: Option<Vec<f32>>,
    times: &mut StepTimes,
) -> Result<(Option<Vec<f32>>, f64, Tape<C>)> {
    let mut x = match x {
        Some(x) => x,
        None => model.embed_forward(mb.tokens)?,
    };
    let mut layers = Vec::with_capacity(st.layers.len());
    for l in st.layers.clone() {
        let (out, tape) = moe_layer::forward(&mut mesh.ep, st, model, l, &x, times)?;
        layers.push(tape);
        x = out;
    }
    if mesh.is_last() {
        let (loss, hs) = model.head_forward(&x, mb.targets, st.normaliser)?;
        Ok((
            None,
            loss,
            Tape {
                layers,
                head: Some(hs),
            },
        ))
    } else {
        Ok((Some(x), 0.0, Tape { layers, head: None }))
    }
}

/// Backward of one micro-batch: `dy` is the next stage's gradient (`None` on the last
/// stage). Returns the gradient for the previous stage (`None` on the first, which
/// accumulates the embedding's gradient).
fn backward<C: StageCompute>(
    mesh: &mut Mesh,
    st: &Stage,
    model: &mut C,
    mb: MicroBatch<'_>,
    tape: Tape<C>,
    dy: Option<Vec<f32>>,
    times: &mut StepTimes,
) -> Result<Option<Vec<f32>>> {
    let mut dx = match (tape.head, dy) {
        (Some(hs), _) => model.head_backward(hs)?,
        (None, Some(dy)) => dy,
        (None, None) => {
            return Err(crate::error::PiperError::Compute(
                "backward of a middle stage without an incoming gradient".into(),
            ));
        }
    };
    for (l, lt) in st.layers.clone().zip(tape.layers).rev() {
        dx = moe_layer::backward(&mut mesh.ep, st, model, l, lt, &dx, times)?;
    }
    if mesh.is_first() {
        model.embed_backward(mb.tokens, &dx)?;
        Ok(None)
    } else {
        Ok(Some(dx))
    }
}

/// Runs 1F1B over `micro` on this stage; returns the sum of this rank's micro-batch losses
/// (0 off the last stage). Every rank of the mesh calls it for the same step.
pub(super) fn one_f_one_b<C: StageCompute>(
    mesh: &mut Mesh,
    st: &Stage,
    model: &mut C,
    micro: &[MicroBatch<'_>],
    times: &mut StepTimes,
) -> Result<(f64, ActivationPeak)> {
    let m_total = micro.len();
    let pp_size = mesh.layout().pp;
    let stage = mesh.stage();
    let (first, last) = (mesh.is_first(), mesh.is_last());
    let len = st.rows * st.hidden;
    let warmup = (pp_size - stage - 1).min(m_total);
    let remaining = m_total - warmup;
    let mut tapes: Tapes<C> = Tapes::new(m_total);
    let mut clock = P2pClock::default();
    let mut loss = 0.0f64;

    // Warm-up forwards.
    for (m, mb) in micro.iter().enumerate().take(warmup) {
        let x = if first {
            None
        } else {
            Some(clock.single(|| recv_forward(&mut mesh.pp, len))?)
        };
        let (y, l, tape) = forward(mesh, st, model, *mb, x, times)?;
        loss += l;
        tapes.put(m, tape);
        if let Some(y) = y {
            clock.single(|| send_forward(&mut mesh.pp, &y))?;
        }
    }

    // Steady state: one forward, one backward.
    let mut x_in = if remaining > 0 && !first {
        Some(clock.single(|| recv_forward(&mut mesh.pp, len))?)
    } else {
        None
    };
    for i in 0..remaining {
        let fm = warmup + i;
        let (y, l, tape) = forward(mesh, st, model, micro[fm], x_in.take(), times)?;
        loss += l;
        tapes.put(fm, tape);
        let dy = match y {
            Some(y) if !last => Some(clock.pair(|| send_forward_recv_backward(&mut mesh.pp, &y))?),
            _ => None,
        };
        let tape = tapes.take(i)?;
        let dx = backward(mesh, st, model, micro[i], tape, dy, times)?;
        if let Some(dx) = dx {
            if i + 1 == remaining {
                clock.single(|| send_backward(&mut mesh.pp, &dx))?;
            } else {
                x_in = Some(clock.pair(|| send_backward_recv_forward(&mut mesh.pp, &dx))?);
            }
        }
    }

    // Cool-down backwards.
    for (bm, mb) in micro.iter().enumerate().skip(remaining) {
        let dy = if last {
            None
        } else {
            Some(clock.single(|| recv_backward(&mut mesh.pp, len))?)
        };
        let tape = tapes.take(bm)?;
        if let Some(dx) = backward(mesh, st, model, *mb, tape, dy, times)? {
            clock.single(|| send_backward(&mut mesh.pp, &dx))?;
        }
    }
    clock.settle(times);
    Ok((loss, tapes.peak))
}

fn missing_tape(m: usize) -> crate::error::PiperError {
    crate::error::PiperError::Compute(format!("1F1B: no saved forward state for micro-batch {m}"))
}

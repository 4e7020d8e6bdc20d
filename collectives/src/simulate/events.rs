//! The simulator's discrete-event loop: post steps whose dependencies completed,
//! start a message when both of its ends are posted, let the sharing model move the
//! bytes, deliver after the latency, unlock dependants.

use super::model::Model;
use super::program::{COPY, NONE, Program, RECV, SEND, decode};
use super::{Egress, Sharer};
use crate::error::{CollectiveError, Result};
use halo_topology::{Level, Topology};
use std::collections::VecDeque;

/// A step that has completed.
const DONE: u32 = u32::MAX;
/// Egress slots per rank (see `Model::slot`).
const SLOTS: usize = 3;
/// Message state bits besides the count of posted ends (0..=2).
const POSTED: u8 = 3;
/// The previous message to the same peer is on the sender's egress port.
const BLOCKED: u8 = 4;
/// Started (both ends posted) and waiting for that message to leave the port.
const WAITING: u8 = 8;

/// What one run produced.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) rank_time: Vec<f64>,
    pub(crate) level_messages: [u64; 6],
    pub(crate) level_bytes: [u64; 6],
    pub(crate) copies: u64,
    pub(crate) copy_bytes: u64,
    pub(crate) events: u64,
    pub(crate) loads: Vec<f64>,
}

/// Deliveries waiting out their latency: one FIFO per level (every delivery of a level
/// waits the same time and they are pushed in time order, so each FIFO is sorted).
/// Times are run-length encoded: a million deliveries due at once cost 4 bytes each.
#[derive(Debug, Default)]
struct Timers {
    ops: [VecDeque<u32>; 6],
    /// (time, how many of the ops are due then), in order.
    times: [VecDeque<(f64, u32)>; 6],
}

impl Timers {
    fn push(&mut self, level: Level, at: f64, op: u32) {
        let l = level as usize;
        self.ops[l].push_back(op);
        match self.times[l].back_mut() {
            Some((t, k)) if t.to_bits() == at.to_bits() && *k < u32::MAX => *k += 1,
            _ => self.times[l].push_back((at, 1)),
        }
    }

    /// The earliest delivery (ties: the innermost level).
    fn next(&self) -> Option<(f64, usize)> {
        let mut best: Option<(f64, usize)> = None;
        for (i, q) in self.times.iter().enumerate() {
            if let Some(&(t, _)) = q.front()
                && best.is_none_or(|b| t < b.0)
            {
                best = Some((t, i));
            }
        }
        best
    }

    fn pop(&mut self, level: usize) -> u32 {
        let front = self.times[level].front_mut().expect("a timer");
        front.1 -= 1;
        if front.1 == 0 {
            self.times[level].pop_front();
        }
        self.ops[level].pop_front().expect("a timer")
    }
}

struct Run<'a, S> {
    prog: &'a Program,
    model: &'a Model,
    topo: &'a Topology,
    sharer: S,
    remaining: Vec<u32>,
    posted: Vec<u8>,
    msg_level: Vec<u8>,
    ready: VecDeque<u32>,
    timers: Timers,
    path: Vec<(u32, f64)>,
    /// `Egress::Fifo`: per (rank, egress slot), the messages waiting for the port and
    /// whether one is on it.
    fifo: bool,
    queues: Vec<VecDeque<u32>>,
    busy: Vec<bool>,
    completed: usize,
    out: Outcome,
}

impl<S: Sharer> Run<'_, S> {
    fn post(&mut self, s: u32, t: f64) {
        let (kind, i) = decode(self.prog.op[s as usize]);
        match kind {
            SEND | RECV => {
                self.posted[i] += 1;
                if self.posted[i] & POSTED == 2 {
                    self.start_message(i, t);
                }
            }
            _ => {
                debug_assert_eq!(kind, COPY);
                let c = self.prog.copies[i];
                let rank = self.prog.rank_of(c.step);
                self.out.copies += 1;
                self.out.copy_bytes += c.bytes;
                self.path.clear();
                if c.bytes > 0 {
                    self.path.push((self.model.memory(rank), c.bytes as f64));
                }
                self.start(self.prog.msgs.len() + i, Level::Device, t);
            }
        }
    }

    fn start_message(&mut self, m: usize, t: f64) {
        let msg = self.prog.msgs[m];
        let a = self.prog.rank_of(msg.send);
        let level = self.topo.meet(a, self.prog.rank_of(msg.recv));
        self.msg_level[m] = level as u8;
        self.out.level_messages[level as usize] += 1;
        self.out.level_bytes[level as usize] += msg.bytes;
        if self.fifo {
            if let Some(slot) = self.model.slot(level) {
                let q = a * SLOTS + slot;
                if self.busy[q] {
                    self.queues[q].push_back(m as u32);
                    return;
                }
                self.busy[q] = true;
            }
        } else if self.posted[m] & BLOCKED != 0 {
            // Wait, and so must whatever follows on this channel.
            self.posted[m] |= WAITING;
            let next = self.prog.next[m];
            if next != NONE {
                self.posted[next as usize] |= BLOCKED;
            }
            return;
        }
        if !self.launch(m, t) {
            self.release(m, t);
        }
    }

    /// Puts message `m` on its path; false when it has nothing to move (straight to
    /// delivery, leaving its egress port at once).
    fn launch(&mut self, m: usize, t: f64) -> bool {
        let msg = self.prog.msgs[m];
        let (a, b) = (self.prog.rank_of(msg.send), self.prog.rank_of(msg.recv));
        let level = self.model.path(self.topo, a, b, msg.bytes, &mut self.path);
        let moves = !self.path.is_empty();
        self.start(m, level, t);
        let next = self.prog.next[m];
        // A message to oneself has no egress port to wait for.
        if moves && !self.fifo && next != NONE && level != Level::Device {
            self.posted[next as usize] |= BLOCKED;
        }
        moves
    }

    /// Message `m` left its sender's egress port: the next message to the same peer
    /// (`Egress::Fifo`: the next through that port) may go.
    fn release(&mut self, mut m: usize, t: f64) {
        if self.fifo {
            let Some(slot) = self.model.slot(self.level_of(m)) else {
                return;
            };
            let q = self.prog.rank_of(self.prog.msgs[m].send) * SLOTS + slot;
            while let Some(next) = self.queues[q].pop_front() {
                if self.launch(next as usize, t) {
                    return;
                }
            }
            self.busy[q] = false;
            return;
        }
        loop {
            let next = self.prog.next[m];
            if next == NONE {
                return;
            }
            let state = &mut self.posted[next as usize];
            *state &= !BLOCKED;
            if *state & WAITING == 0 {
                return;
            }
            *state &= !WAITING;
            if self.launch(next as usize, t) {
                return;
            }
            m = next as usize;
        }
    }

    /// Starts operation `op` on `self.path` (nothing to move: straight to delivery).
    fn start(&mut self, op: usize, level: Level, t: f64) {
        if self.path.is_empty() {
            self.timers
                .push(level, t + self.model.latency[level as usize], op as u32);
        } else {
            self.sharer.add(t, op as u32, &self.path);
        }
    }

    fn level_of(&self, op: usize) -> Level {
        if op < self.prog.msgs.len() {
            Level::ALL[self.msg_level[op] as usize]
        } else {
            Level::Device
        }
    }

    fn complete_op(&mut self, op: usize, t: f64) {
        if op < self.prog.msgs.len() {
            let m = self.prog.msgs[op];
            self.complete_step(m.send, t);
            self.complete_step(m.recv, t);
        } else {
            let c = self.prog.copies[op - self.prog.msgs.len()];
            self.complete_step(c.step, t);
        }
    }

    fn complete_step(&mut self, s: u32, t: f64) {
        debug_assert_eq!(self.remaining[s as usize], 0);
        self.remaining[s as usize] = DONE;
        self.completed += 1;
        let rank = self.prog.rank_of(s);
        let rt = &mut self.out.rank_time[rank];
        *rt = rt.max(t);
        for &d in self.prog.dependants(s) {
            let r = &mut self.remaining[d as usize];
            *r -= 1;
            if *r == 0 {
                self.ready.push_back(d);
            }
        }
    }
}

/// Replays `prog` on `model` with the given sharing model.
/// `remaining` is the program's dependency counts (taken from it: it is consumed).
pub(crate) fn run<S: Sharer>(
    prog: &Program,
    remaining: Vec<u32>,
    model: &Model,
    topo: &Topology,
    sharer: S,
    egress: Egress,
) -> Result<Outcome> {
    let fifo = egress == Egress::Fifo;
    let slots = if fifo { prog.n * SLOTS } else { 0 };
    let steps = prog.op.len();
    let mut run = Run {
        prog,
        model,
        topo,
        sharer,
        remaining,
        posted: vec![0; prog.msgs.len()],
        msg_level: vec![0; prog.msgs.len()],
        ready: VecDeque::new(),
        timers: Timers::default(),
        path: Vec::with_capacity(16),
        fifo,
        queues: vec![VecDeque::new(); slots],
        busy: vec![false; slots],
        completed: 0,
        out: Outcome {
            rank_time: vec![0.0; prog.n],
            level_messages: [0; 6],
            level_bytes: [0; 6],
            copies: 0,
            copy_bytes: 0,
            events: 0,
            loads: Vec::new(),
        },
    };
    let mut t = 0.0f64;
    // Steps without dependencies are posted at 0, rank by rank, in program order.
    for s in 0..steps as u32 {
        if run.remaining[s as usize] == 0 {
            run.post(s, t);
        }
    }
    let mut done = Vec::new();
    let mut released = Vec::new();
    loop {
        while let Some(s) = run.ready.pop_front() {
            run.post(s, t);
        }
        run.sharer.flush();
        let flow = run.sharer.next();
        let timer = run.timers.next();
        match (timer, flow) {
            (None, None) => break,
            (Some((tt, q)), f) if f.is_none_or(|f| tt <= f) => {
                t = tt;
                let op = run.timers.pop(q);
                run.complete_op(op as usize, t);
            }
            (_, Some(tf)) => {
                t = tf;
                done.clear();
                released.clear();
                run.sharer.pop(t, &mut done, &mut released);
                for &op in &released {
                    if (op as usize) < prog.msgs.len() {
                        run.release(op as usize, t);
                    }
                }
                for &op in &done {
                    let level = run.level_of(op as usize);
                    run.timers
                        .push(level, t + model.latency[level as usize], op);
                }
            }
            (Some(_), None) => unreachable!("covered by the guard above"),
        }
        run.out.events += 1;
    }
    if run.completed < steps {
        let stuck = (0..steps as u32)
            .find(|&s| run.remaining[s as usize] != DONE)
            .expect("a step that did not complete");
        return Err(CollectiveError::InvalidUsage(format!(
            "the schedules deadlock: {} of {steps} steps never complete, the first being {}",
            steps - run.completed,
            prog.describe(stuck)
        )));
    }
    run.out.loads = run.sharer.loads().to_vec();
    Ok(run.out)
}

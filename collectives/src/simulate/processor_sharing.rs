//! The fast sharing model: every resource is an independent processor-sharing server.
//!
//! Each resource keeps a *virtual time* `V`: the service every one of its active
//! flows has received so far, advancing at `capacity / active` per second. A flow of
//! demand `d` that joins at `V0` leaves the resource when `V = V0 + d` (its *tag*);
//! the resource's next departure is its smallest tag. A flow is done when it has left
//! every resource on its path. Adding or removing a flow costs O(log n) on the
//! resources it touches and nothing elsewhere, so a million concurrent flows are cheap.
//!
//! The approximation: a flow is served at its fair share on every resource at once,
//! independently, instead of at one rate (the minimum over its path, as max-min
//! fairness would give). Every resource is work-conserving and never exceeds its
//! capacity, so the time to drain a bottleneck is exact; what differs is the order in
//! which flows leave a resource they do not bottleneck on. [`super::maxmin`] is the exact
//! reference for small cases.

use super::Sharer;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A departure tag on one resource: of one flow (`id` = its op), or of a bucket of
/// flows that joined at the same virtual time with the same demand (`id` = `BUCKET`
/// | bucket index) — the common case when a rank posts many equal messages at once,
/// which then cost 4 bytes and O(1) each instead of a heap entry.
#[derive(Debug, Clone, Copy)]
struct Entry {
    tag: f64,
    id: u32,
}

const BUCKET: u32 = 1 << 31;

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed, so that `BinaryHeap` pops the smallest tag (then the smallest id).
    fn cmp(&self, other: &Self) -> Ordering {
        other.tag.total_cmp(&self.tag).then(other.id.cmp(&self.id))
    }
}

#[derive(Debug, Default)]
struct Res {
    cap: f64,
    /// Virtual time at `t`.
    v: f64,
    t: f64,
    active: u32,
    queue: BinaryHeap<Entry>,
    /// The last entry pushed, while it is in the queue: a flow with the same tag joins
    /// its bucket.
    last: Option<Entry>,
}

impl Res {
    fn advance(&mut self, t: f64) {
        if self.active > 0 {
            self.v += (t - self.t) * self.cap / self.active as f64;
        }
        self.t = t;
    }

    fn next(&self) -> Option<f64> {
        let top = self.queue.peek()?;
        let dt = (top.tag - self.v).max(0.0) * self.active as f64 / self.cap;
        Some(self.t + dt)
    }
}

/// A binary min-heap of resources keyed by their next departure time (ties: lower
/// resource id), with positions so that keys can change.
#[derive(Debug, Default)]
struct IndexHeap {
    heap: Vec<u32>,
    pos: Vec<u32>,
    key: Vec<f64>,
}

const ABSENT: u32 = u32::MAX;

impl IndexHeap {
    fn new(n: usize) -> Self {
        IndexHeap {
            heap: Vec::new(),
            pos: vec![ABSENT; n],
            key: vec![0.0; n],
        }
    }

    fn less(&self, a: u32, b: u32) -> bool {
        match self.key[a as usize].total_cmp(&self.key[b as usize]) {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal => a < b,
        }
    }

    fn swap(&mut self, i: usize, j: usize) {
        self.heap.swap(i, j);
        self.pos[self.heap[i] as usize] = i as u32;
        self.pos[self.heap[j] as usize] = j as u32;
    }

    fn up(&mut self, mut i: usize) {
        while i > 0 {
            let p = (i - 1) / 2;
            if !self.less(self.heap[i], self.heap[p]) {
                break;
            }
            self.swap(i, p);
            i = p;
        }
    }

    fn down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < self.heap.len() && self.less(self.heap[l], self.heap[m]) {
                m = l;
            }
            if r < self.heap.len() && self.less(self.heap[r], self.heap[m]) {
                m = r;
            }
            if m == i {
                break;
            }
            self.swap(i, m);
            i = m;
        }
    }

    fn set(&mut self, r: u32, key: Option<f64>) {
        let at = self.pos[r as usize];
        match (key, at) {
            (Some(k), ABSENT) => {
                self.key[r as usize] = k;
                self.pos[r as usize] = self.heap.len() as u32;
                self.heap.push(r);
                self.up(self.heap.len() - 1);
            }
            (Some(k), i) => {
                self.key[r as usize] = k;
                self.up(i as usize);
                self.down(self.pos[r as usize] as usize);
            }
            (None, ABSENT) => {}
            (None, i) => {
                let i = i as usize;
                let last = self.heap.len() - 1;
                self.swap(i, last);
                self.heap.pop();
                self.pos[r as usize] = ABSENT;
                if i < self.heap.len() {
                    self.up(i);
                    self.down(self.pos[self.heap[i] as usize] as usize);
                }
            }
        }
    }

    fn top(&self) -> Option<(u32, f64)> {
        self.heap.first().map(|&r| (r, self.key[r as usize]))
    }
}

/// Independent processor sharing on every resource.
#[derive(Debug)]
pub(crate) struct ProcessorSharing {
    res: Vec<Res>,
    /// Per operation: resources it has not left yet.
    left: Vec<u8>,
    heap: IndexHeap,
    dirty: Vec<u32>,
    is_dirty: Vec<bool>,
    load: Vec<f64>,
    gone: Vec<u32>,
    gate: Vec<bool>,
    buckets: Vec<Vec<u32>>,
    free: Vec<u32>,
}

impl ProcessorSharing {
    pub(crate) fn new(cap: &[f64], gate: &[bool], ops: usize) -> Self {
        ProcessorSharing {
            res: cap
                .iter()
                .map(|&cap| Res {
                    cap,
                    ..Res::default()
                })
                .collect(),
            left: vec![0; ops],
            heap: IndexHeap::new(cap.len()),
            dirty: Vec::new(),
            is_dirty: vec![false; cap.len()],
            load: vec![0.0; cap.len()],
            gone: Vec::new(),
            gate: gate.to_vec(),
            buckets: Vec::new(),
            free: Vec::new(),
        }
    }

    fn touch(&mut self, r: u32) {
        if !self.is_dirty[r as usize] {
            self.is_dirty[r as usize] = true;
            self.dirty.push(r);
        }
    }
}

impl Sharer for ProcessorSharing {
    fn add(&mut self, t: f64, op: u32, path: &[(u32, f64)]) {
        debug_assert!(!path.is_empty() && path.len() < 256);
        self.left[op as usize] = path.len() as u8;
        for &(r, d) in path {
            self.load[r as usize] += d;
            let res = &mut self.res[r as usize];
            res.advance(t);
            let tag = res.v + d;
            res.active += 1;
            match res.last {
                Some(e) if e.tag.to_bits() == tag.to_bits() && e.id & BUCKET != 0 => {
                    self.buckets[(e.id & !BUCKET) as usize].push(op);
                }
                Some(e) if e.tag.to_bits() == tag.to_bits() => {
                    // A second flow with this tag: open a bucket for it and those to come.
                    let b = match self.free.pop() {
                        Some(b) => b,
                        None => {
                            self.buckets.push(Vec::new());
                            (self.buckets.len() - 1) as u32
                        }
                    };
                    self.buckets[b as usize].push(op);
                    let e = Entry {
                        tag,
                        id: BUCKET | b,
                    };
                    res.queue.push(e);
                    res.last = Some(e);
                }
                _ => {
                    let e = Entry { tag, id: op };
                    res.queue.push(e);
                    res.last = Some(e);
                }
            }
            self.touch(r);
        }
    }

    fn flush(&mut self) {
        for r in std::mem::take(&mut self.dirty) {
            self.is_dirty[r as usize] = false;
            let next = self.res[r as usize].next();
            self.heap.set(r, next);
        }
    }

    fn next(&self) -> Option<f64> {
        self.heap.top().map(|(_, t)| t)
    }

    fn pop(&mut self, t: f64, done: &mut Vec<u32>, released: &mut Vec<u32>) {
        let (r, _) = self.heap.top().expect("a pending departure");
        let ProcessorSharing {
            res,
            left,
            gone,
            gate,
            buckets,
            free,
            ..
        } = self;
        let res = &mut res[r as usize];
        res.advance(t);
        gone.clear();
        let mut take = |e: Entry, gone: &mut Vec<u32>| {
            if e.id & BUCKET == 0 {
                gone.push(e.id);
            } else {
                let b = (e.id & !BUCKET) as usize;
                gone.append(&mut buckets[b]);
                free.push(b as u32);
            }
        };
        let first = res.queue.pop().expect("an active flow");
        res.v = res.v.max(first.tag);
        take(first, gone);
        // Flows whose tags equal this one (up to rounding) leave together.
        let limit = res.v + res.v.abs() * 1e-12;
        while let Some(&e) = res.queue.peek().filter(|e| e.tag <= limit) {
            res.queue.pop();
            take(e, gone);
        }
        if res.last.is_some_and(|l| l.tag <= limit) {
            res.last = None;
        }
        res.active -= gone.len() as u32;
        if res.active == 0 {
            // Start afresh so that virtual time does not grow without bound.
            res.v = 0.0;
            res.last = None;
        }
        if gate[r as usize] {
            released.extend_from_slice(gone);
        }
        for &op in gone.iter() {
            let l = &mut left[op as usize];
            *l -= 1;
            if *l == 0 {
                done.push(op);
            }
        }
        self.touch(r);
    }

    fn loads(&self) -> &[f64] {
        &self.load
    }
}

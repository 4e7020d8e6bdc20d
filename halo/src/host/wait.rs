//! How a rank waits when nothing completes: it spins while the wait is young, then
//! yields the processor, then sleeps (bounded). Each transport makes its own
//! [`WaitPolicy`] with its own numbers, and measures the wait its own way (how long it
//! has been idle, or how long it may still wait); [`WaitPolicy::step`] is the one
//! decision.

use std::time::Duration;

/// When a waiting rank spins, yields and sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Below this (of the transport's measure of the wait) it spins.
    pub spin: Duration,
    /// Below this (and not below `spin`) it yields the processor: a sleep costs a
    /// system call and its granularity is tens of microseconds (timer slack).
    pub yield_below: Duration,
    /// The longest single sleep (a lost wake-up costs at most this).
    pub sleep_max: Duration,
}

/// What a waiting rank does next ([`WaitPolicy::step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Spin (a few pauses) and look again.
    Spin,
    /// Yield the processor (`sched_yield`) and look again.
    Yield,
    /// Sleep up to this long (at least 1 us, at most `sleep_max`).
    Sleep(Duration),
}

impl WaitPolicy {
    /// What to do at `waited` (the transport's measure of this wait, compared with
    /// `spin` and `yield_below`) when it may wait up to `max` more.
    pub fn step(&self, waited: Duration, max: Duration) -> Step {
        if waited < self.spin {
            Step::Spin
        } else if waited < self.yield_below {
            Step::Yield
        } else {
            Step::Sleep(max.clamp(Duration::from_micros(1), self.sleep_max))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_then_yields_then_sleeps_bounded() {
        let us = Duration::from_micros;
        let p = WaitPolicy {
            spin: us(10),
            yield_below: us(50),
            sleep_max: us(200),
        };
        assert_eq!(p.step(us(0), us(1000)), Step::Spin);
        assert_eq!(p.step(us(10), us(1000)), Step::Yield);
        assert_eq!(p.step(us(50), us(1000)), Step::Sleep(us(200)));
        assert_eq!(p.step(us(50), us(70)), Step::Sleep(us(70)));
        assert_eq!(p.step(us(50), Duration::ZERO), Step::Sleep(us(1)));
    }
}

//! Per-client request rate limit for the admission socket: one token bucket per peer uid
//! (from SO_PEERCRED), refilled at `rate` tokens per second up to `rate` tokens (one second of
//! burst). Pure: the caller passes the time, so tests need no clock.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// Most distinct peers tracked; past it, buckets that have refilled are forgotten (they carry no
/// state a fresh bucket would not).
const MAX_PEERS: usize = 1024;

#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    buckets: HashMap<u32, Bucket>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// `per_second` requests per second per peer, with as much burst; 0 turns the limit off.
    pub fn new(per_second: u32) -> Self {
        Self {
            rate: f64::from(per_second),
            buckets: HashMap::new(),
        }
    }

    /// Takes one token for `peer` at `now`: `Ok` to serve the request, or `Err(wait)` with how
    /// long until a token is available.
    pub fn check(&mut self, peer: u32, now: Instant) -> Result<(), Duration> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let rate = self.rate;
        if self.buckets.len() >= MAX_PEERS && !self.buckets.contains_key(&peer) {
            self.buckets
                .retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < rate);
        }
        let b = self.buckets.entry(peer).or_insert(Bucket {
            tokens: rate,
            at: now,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * rate).min(rate);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refill_per_peer() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(10);
        for i in 0..10 {
            assert!(l.check(0, t0).is_ok(), "request {i} of the burst");
        }
        let wait = l.check(0, t0).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        // Another peer has its own bucket.
        assert!(l.check(1000, t0).is_ok());
        // A tenth of a second later one token is back, and only one.
        let t1 = t0 + Duration::from_millis(100);
        assert!(l.check(0, t1).is_ok());
        assert!(l.check(0, t1).is_err());
        // Refill is capped at one second's worth.
        let t2 = t1 + Duration::from_secs(60);
        let served = (0..100).filter(|_| l.check(0, t2).is_ok()).count();
        assert_eq!(served, 10);
    }

    #[test]
    fn zero_means_unlimited() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(0);
        assert!((0..100_000).all(|_| l.check(0, t0).is_ok()));
    }

    #[test]
    fn peer_table_stays_bounded() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(5);
        for uid in 0..10 * MAX_PEERS as u32 {
            let _ = l.check(uid, t0 + Duration::from_secs(u64::from(uid)));
        }
        assert!(l.buckets.len() <= MAX_PEERS, "{}", l.buckets.len());
    }
}

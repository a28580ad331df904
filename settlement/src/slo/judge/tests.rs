use proptest::prelude::*;

use super::*;
use crate::slo::latency::bucket_of;

fn policy(max_fail_ppm: u32, min_requests: u64) -> Policy {
    Policy {
        max_fail_ppm,
        min_requests,
        p95_latency_ms: 0,
        p95_ttft_ms: 0,
        credit_ppm: 250_000,
    }
}

fn totals(ok: u64, cancel: u64, client: u64, transient: u64, auth: u64) -> Counters {
    Counters {
        requests: ok + cancel + client + transient + auth,
        ok,
        cancel,
        client,
        transient,
        auth,
        amount: ok * 10,
        ..Counters::default()
    }
}

#[test]
fn exactly_at_the_ceiling_is_met_one_more_failure_breaches() {
    // 10% ceiling, 100 judged calls: 10 failures met, 11 breached.
    let p = policy(100_000, 1);
    let h = Histogram::default();
    let met = decide("p", 1, &p, &totals(90, 0, 0, 10, 0), &h);
    assert_eq!(met.status, Status::Met);
    assert_eq!(met.fail_ppm, 100_000);
    let over = decide("p", 1, &p, &totals(89, 0, 0, 10, 1), &h);
    assert_eq!(over.status, Status::Breached);
    assert_eq!(over.reasons, ["fail_rate"]);
    assert_eq!(over.fail_ppm, 110_000);
}

#[test]
fn cancellations_and_client_errors_never_count() {
    // 20 ok, 1 transient; 500 cancelled and 500 client errors would make the
    // fail rate tiny if they counted as judged calls, and huge if they
    // counted as failures: judged = 21, 1/21 = 47619 ppm.
    let p = policy(50_000, 21);
    let v = decide(
        "p",
        1,
        &p,
        &totals(20, 500, 500, 1, 0),
        &Histogram::default(),
    );
    assert_eq!(v.judged, 21);
    assert_eq!(v.fail_count, 1);
    assert_eq!(v.fail_ppm, 47_619);
    assert_eq!(v.status, Status::Met);
    // The same calls with a minimum of 22: not judged, whatever the cancels.
    let v = decide(
        "p",
        1,
        &policy(50_000, 22),
        &totals(20, 500, 500, 1, 0),
        &Histogram::default(),
    );
    assert_eq!(v.status, Status::NotJudged);
    assert!(v.reasons.is_empty());
}

#[test]
fn p95_latency_breaches_when_more_than_one_in_twenty_is_at_the_ceiling() {
    let mut p = policy(1_000_000, 20);
    p.p95_latency_ms = 512;
    let mut h = Histogram::default();
    // 100 measured: 95 at 100 ms, 5 at 600 ms. The 95th smallest is 100 ms:
    // met. A sixth slow call makes the 95th of 101 ... still the 95th fast
    // one? ceil(0.95 * 101) = 96th smallest is slow: breached.
    h.latency.add(bucket_of(100), 95);
    h.latency.add(bucket_of(600), 5);
    let t = totals(100, 0, 0, 0, 0);
    assert_eq!(decide("p", 1, &p, &t, &h).status, Status::Met);
    h.latency.add(bucket_of(512), 1);
    let v = decide("p", 1, &p, &totals(101, 0, 0, 0, 0), &h);
    assert_eq!(v.status, Status::Breached);
    assert_eq!(v.reasons, ["latency"]);
    assert_eq!((v.measured_latency, v.slow_latency), (101, 6));
    // TTFT objective, unmeasured: never judged on it.
    p.p95_ttft_ms = 256;
    assert_eq!(
        decide("p", 1, &p, &t, &Histogram::default()).status,
        Status::Met
    );
}

#[test]
fn reputation_decays_by_a_sixteenth_per_window_by_hand() {
    let r = Reputation::default();
    assert_eq!(r.score_ppm, 1_000_000);
    let r = r.after(5, true);
    assert_eq!(r.score_ppm, 937_500);
    let r = r.after(6, true);
    assert_eq!(r.score_ppm, 878_906); // 937500 * 15 / 16 = 878906.25
    let r = r.after(7, false);
    assert_eq!(r.score_ppm, 886_474); // (878906 * 15 + 1000000) / 16 = 886474.375
    assert_eq!((r.judged, r.breached, r.last_window), (3, 2, 7));
    // The half-life: 11 breaches from 1000000 leave less than half.
    let mut r = Reputation::default();
    for w in 0..10 {
        r = r.after(w, true);
    }
    assert!(r.score_ppm > 500_000, "{}", r.score_ppm);
    assert!(r.after(10, true).score_ppm < 500_000);
}

#[test]
fn credits_round_up_for_the_user_and_never_pass_the_amount() {
    let mut v = decide(
        "p",
        1,
        &policy(0, 1),
        &totals(0, 0, 0, 1, 0),
        &Histogram::default(),
    );
    assert_eq!(v.status, Status::Breached);
    v.policy.credit_ppm = 333_333;
    assert_eq!(credit_on(Some(&v), 3), 1); // 0.999999 rounds up
    assert_eq!(credit_on(Some(&v), 10), 4); // 3.33333 rounds up
    assert_eq!(credit_on(Some(&v), 0), 0);
    v.policy.credit_ppm = 1_000_000;
    assert_eq!(credit_on(Some(&v), u64::MAX), u64::MAX);
    v.status = Status::Met;
    assert_eq!(credit_on(Some(&v), 10), 0);
    assert_eq!(credit_on(None, 10), 0);
}

/// The breach rule written again from the ADR, on plain integers: the
/// oracle `decide` is compared with.
fn model(p: &Policy, ok: u64, cancel: u64, client: u64, fails: u64) -> Status {
    let judged = ok + fails; // cancel and client are never judged
    let _ = (cancel, client);
    if judged < p.min_requests {
        Status::NotJudged
    } else if fails as f64 / judged as f64 > p.max_fail_ppm as f64 / 1e6 + 1e-12 {
        Status::Breached
    } else {
        Status::Met
    }
}

proptest! {
    #[test]
    fn decide_agrees_with_the_model(
        ok in 0u64..300, cancel in 0u64..300, client in 0u64..300,
        transient in 0u64..100, auth in 0u64..100,
        max_fail_ppm in 0u32..=1_000_000, min_requests in 1u64..200,
    ) {
        let p = policy(max_fail_ppm, min_requests);
        let v = decide("p", 1, &p, &totals(ok, cancel, client, transient, auth), &Histogram::default());
        prop_assert_eq!(v.status, model(&p, ok, cancel, client, transient + auth));
    }

    #[test]
    fn credits_conserve_money(
        owed in proptest::collection::vec(0u64..1_000_000_000, 1..50),
        credit_ppm in 0u32..=1_000_000,
    ) {
        let mut v = decide("p", 1, &policy(0, 1), &totals(0, 0, 0, 1, 0), &Histogram::default());
        v.policy.credit_ppm = credit_ppm;
        for &a in &owed {
            let c = credit_on(Some(&v), a);
            let paid = a - c;
            // In the user's favour: the provider gets at most its share.
            prop_assert!(u128::from(paid) * 1_000_000 <= u128::from(a) * u128::from(1_000_000 - credit_ppm));
            // And the credit is less than one credit above the exact share.
            prop_assert!(u128::from(c) * 1_000_000 < u128::from(a) * u128::from(credit_ppm) + 1_000_000);
        }
    }
}

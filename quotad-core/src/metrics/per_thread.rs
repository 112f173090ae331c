//! The check metrics, kept as one copy per thread slot and scraped as their sum.
//!
//! Every check adds to `quotad_checks_total` and `quotad_check_duration_seconds`. With one
//! copy of each, the actix workers all wrote the same atomics: five read-modify-writes a check
//! on cache lines that moved between the cores at every check. Here each thread writes the copy
//! of its slot (`mine`), so a worker's lines stay in its core's cache; a scrape adds the copies
//! up, so what `/metrics` shows is exact and the same series as one copy would give.
//!
//! Threads take slots in the order they first record a check; more threads than slots share
//! slots, which stays exact (the copies are atomics) and only brings back some sharing.

use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};

/// Copies of each metric: more than the worker threads of the machines quotad runs on is not
/// needed, since slots are only handed out to threads that record checks.
const SLOTS: usize = 16;

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SLOTS;
}

/// One metric (or metric vector) as [`SLOTS`] copies.
#[derive(Clone)]
pub(super) struct PerThread<M> {
    copies: Box<[M]>,
}

impl<M> PerThread<M> {
    /// `make` builds one copy; every copy of a metric must have the same name, help and
    /// labels.
    pub(super) fn new(make: impl Fn() -> M) -> Self {
        Self {
            copies: (0..SLOTS).map(|_| make()).collect(),
        }
    }

    /// The copy this thread writes.
    pub(super) fn mine(&self) -> &M {
        &self.copies[SLOT.with(|s| *s)]
    }

    /// What `f` makes of each copy, kept per thread the same way (a vector's resolved
    /// children, say).
    pub(super) fn map<U>(&self, f: impl Fn(&M) -> U) -> PerThread<U> {
        PerThread {
            copies: self.copies.iter().map(f).collect(),
        }
    }
}

impl<M: Collector> Collector for PerThread<M> {
    fn desc(&self) -> Vec<&Desc> {
        self.copies[0].desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.copies[0].collect();
        for copy in &self.copies[1..] {
            for (sum, family) in families.iter_mut().zip(copy.collect()) {
                add_family(sum, &family);
            }
        }
        families
    }
}

/// Adds `more`'s series into `sum`'s, matching series by their labels (a vector's copies may
/// list them in different orders, and a series one copy lacks is taken as it is).
fn add_family(sum: &mut MetricFamily, more: &MetricFamily) {
    let kind = sum.get_field_type();
    for m in more.get_metric() {
        let same = sum
            .mut_metric()
            .iter_mut()
            .find(|s| s.get_label() == m.get_label());
        match same {
            Some(s) => add_metric(kind, s, m),
            None => sum.mut_metric().push(m.clone()),
        }
    }
}

fn add_metric(kind: MetricType, sum: &mut proto::Metric, more: &proto::Metric) {
    match kind {
        MetricType::COUNTER => {
            let mut c = proto::Counter::default();
            c.set_value(sum.get_counter().get_value() + more.get_counter().get_value());
            sum.set_counter(c);
        }
        MetricType::HISTOGRAM => {
            let (a, b) = (sum.get_histogram(), more.get_histogram());
            let mut h = proto::Histogram::default();
            h.set_sample_count(a.get_sample_count() + b.get_sample_count());
            h.set_sample_sum(a.get_sample_sum() + b.get_sample_sum());
            // The copies share their bounds: the cumulative counts add up bucket by bucket.
            h.set_bucket(
                a.get_bucket()
                    .iter()
                    .zip(b.get_bucket())
                    .map(|(x, y)| {
                        let mut bucket = proto::Bucket::default();
                        bucket.set_upper_bound(x.upper_bound());
                        bucket.set_cumulative_count(x.cumulative_count() + y.cumulative_count());
                        bucket
                    })
                    .collect(),
            );
            sum.set_histogram(h);
        }
        // Only counters and histograms are kept per thread.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry, TextEncoder};

    /// Durations whose sums are exact in any order (powers of two), one per bucket.
    const OBSERVED: [f64; 4] = [1.0 / 1024.0, 1.0 / 128.0, 1.0 / 16.0, 0.5];

    fn text(r: &Registry) -> String {
        TextEncoder::new().encode_to_string(&r.gather()).unwrap()
    }

    /// What threads record on their own copies reads back as one metric's exact totals,
    /// byte for byte what a single shared copy shows for the same observations.
    #[test]
    fn copies_written_from_many_threads_scrape_as_one_metric() {
        let opts = || Opts::new("t_checks_total", "Checks.");
        let counters = PerThread::new(|| IntCounterVec::new(opts(), &["decision"]).unwrap());
        let hist_opts =
            || HistogramOpts::new("t_seconds", "Durations.").buckets(vec![0.001, 0.01, 0.1]);
        let hists = PerThread::new(|| Histogram::with_opts(hist_opts()).unwrap());
        let one_counter = IntCounterVec::new(opts(), &["decision"]).unwrap();
        let one_hist = Histogram::with_opts(hist_opts()).unwrap();

        let threads: Vec<_> = (0..SLOTS + 3)
            .map(|i| {
                let (counters, hists) = (counters.clone(), hists.clone());
                std::thread::spawn(move || {
                    for n in 0..=i {
                        let label = if n % 3 == 0 { "denied" } else { "allowed" };
                        counters.mine().with_label_values(&[label]).inc();
                        hists.mine().observe(OBSERVED[n % 4]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for i in 0..SLOTS + 3 {
            for n in 0..=i {
                let label = if n % 3 == 0 { "denied" } else { "allowed" };
                one_counter.with_label_values(&[label]).inc();
                one_hist.observe(OBSERVED[n % 4]);
            }
        }

        let (per_thread, shared) = (Registry::new(), Registry::new());
        per_thread.register(Box::new(counters)).unwrap();
        per_thread.register(Box::new(hists)).unwrap();
        shared.register(Box::new(one_counter)).unwrap();
        shared.register(Box::new(one_hist)).unwrap();
        let got = text(&per_thread);
        assert_eq!(got, text(&shared));
        // 19 threads recorded 1 + 2 + ... + 19 checks.
        assert!(got.contains("t_seconds_count 190"), "{got}");
    }

    #[test]
    fn a_thread_keeps_its_slot() {
        let first = SLOT.with(|s| *s);
        assert_eq!(SLOT.with(|s| *s), first);
        let other = std::thread::spawn(|| SLOT.with(|s| *s)).join().unwrap();
        assert!(other < SLOTS);
    }
}

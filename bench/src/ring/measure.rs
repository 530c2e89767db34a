//! One run: a throughput run of one ring in one publication mode
//! ([`Run`]) or a ping-pong ([`PingPong`]), the parent producing and a peer
//! process consuming.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use granary_shm::layout::{BatchDescriptor, ReleaseDescriptor};
use granary_shm::ring::Producer;

use super::scenario::{
    baseline_memory, granary_segment, item, new_epoch, second_ring_offset, Kind, Publish, BASELINE,
};
use super::{
    Options, Result, LONG_SPIN, NEAR_NS, NO_CPU, PING_CAPACITY, PROBE_SAMPLES, SAMPLE_EVERY,
    TIMEOUT,
};
use crate::baseline::{self, BaseProducer};
use crate::cpu::{current_cpu, CpuSamples, Placement};
use crate::peer::Peer;
use crate::report::{median, percentile};

/// Progress marks the producer takes every [`SAMPLE_EVERY`] items: where it
/// ran, and when (items written, time). The ring holds at most `capacity`
/// items, so the producer's pace is the consumer's pace to within that.
#[derive(Default)]
pub struct Marks {
    cpus: CpuSamples,
    times: Vec<(u64, Instant)>,
}

impl Marks {
    #[inline(never)]
    pub fn mark(&mut self, items: u64) {
        self.times.push((items, Instant::now()));
        self.cpus.sample();
    }

    /// Median ns/item over the intervals between marks (robust to a few
    /// intervals stretched by other processes); NaN without two marks.
    pub fn median_slice_ns(&self) -> f64 {
        let slices: Vec<f64> = self
            .times
            .windows(2)
            .filter(|w| w[1].0 > w[0].0)
            .map(|w| (w[1].1 - w[0].1).as_nanos() as f64 / (w[1].0 - w[0].0) as f64)
            .collect();
        median(&slices)
    }
}

/// One throughput run as seen by the parent.
pub struct Run {
    pub ns_per_item: f64,
    pub slice_ns_per_item: f64,
    pub placement: Placement,
    pub parent_cpus: CpuSamples,
    pub peer_cpus: CpuSamples,
    pub empty_polls: u64,
    pub full_waits: u64,
    /// Whether the repetition's distance probe said "near".
    pub near: bool,
}

pub fn throughput_run(
    kind: Kind,
    publish: Publish,
    o: &Options,
    run_no: u64,
    want: u64,
) -> Result<Run> {
    let epoch = new_epoch(run_no);
    let n = o.items;
    let args = vec![
        "tp".to_owned(),
        kind.name(),
        n.to_string(),
        o.pop.to_string(),
        epoch.to_string(),
        o.capacity.to_string(),
    ];
    let mut marks = Marks::default();
    let (elapsed, done, full_waits) = match kind {
        Kind::Granary => {
            let (mut seg, fd) = granary_segment(o.capacity, 64, epoch)?;
            let (mut prod, _release) = seg.take_endpoints().ok_or("endpoints already taken")?;
            let mut peer = Peer::spawn(fd, &args)?;
            peer.expect("ready")?;
            marks.mark(0);
            let t0 = Instant::now();
            let waits = produce_granary(&mut prod, n, publish, &mut marks)?;
            let done = peer.expect("done")?;
            let elapsed = t0.elapsed();
            peer.finish()?;
            (elapsed, done, waits)
        }
        Kind::Baseline(_) | Kind::MinRing => {
            let tuning = kind.baseline().ok_or("not a baseline ring")?;
            let cap = o.capacity as usize;
            let (region, fd) = baseline_memory(baseline::ring_bytes::<BatchDescriptor>(cap))?;
            // SAFETY: fresh zeroed memfd; this is the ring's only producer and
            // the peer creates its only consumer.
            let mut prod =
                unsafe { baseline::producer::<BatchDescriptor>(region, 0, cap) }.tuned(tuning);
            let mut peer = Peer::spawn(fd, &args)?;
            peer.expect("ready")?;
            marks.mark(0);
            let t0 = Instant::now();
            produce_baseline(&mut prod, n, publish.k(), &mut marks)?;
            let done = peer.expect("done")?;
            let elapsed = t0.elapsed();
            peer.finish()?;
            (elapsed, done, prod.full_waits())
        }
    };
    // done: checksum ok empty_polls cpus
    let [sum, ok, polls, peer_cpus] = <[String; 4]>::try_from(done)
        .map_err(|d| format!("malformed done line from peer: {d:?}"))?;
    if ok != "1" || sum.parse::<u64>()? != want {
        return Err(format!(
            "{} run: items arrived out of order or corrupted",
            kind.name()
        )
        .into());
    }
    let peer_cpus = CpuSamples::decode(&peer_cpus).ok_or("malformed cpu samples from peer")?;
    Ok(Run {
        ns_per_item: elapsed.as_nanos() as f64 / n as f64,
        slice_ns_per_item: marks.median_slice_ns(),
        placement: Placement::of(&marks.cpus, &peer_cpus),
        parent_cpus: marks.cpus,
        peer_cpus,
        empty_polls: polls.parse()?,
        full_waits,
        near: true,
    })
}

// Kept out of line so both rings' loops are compiled on equal terms.
#[inline(never)]
pub fn produce_granary(
    prod: &mut Producer<BatchDescriptor>,
    n: u64,
    publish: Publish,
    marks: &mut Marks,
) -> Result<u64> {
    let mut i = 0;
    let mut waits = 0;
    let mut mark_at = SAMPLE_EVERY;
    while i < n {
        match publish {
            Publish::PerItem => {
                if prod.try_push(item(i))? {
                    i += 1;
                } else {
                    waits += 1;
                    if !prod.wait_for_space(Some(TIMEOUT))? {
                        return Err("granary ring: consumer stalled".into());
                    }
                }
            }
            Publish::Batched(k) => {
                let end = (i + k).min(n);
                while i < end {
                    let base = i;
                    let got = prod.stage_with((end - i) as usize, |j| item(base + j as u64))?;
                    i += got as u64;
                    if i < end {
                        waits += 1;
                        if !prod.wait_for_space(Some(TIMEOUT))? {
                            return Err("granary ring: consumer stalled".into());
                        }
                    }
                }
                prod.publish();
            }
        }
        if i >= mark_at {
            marks.mark(i);
            mark_at += SAMPLE_EVERY;
        }
    }
    Ok(waits)
}

// Kept out of line so both rings' loops are compiled on equal terms.
#[inline(never)]
pub fn produce_baseline(
    prod: &mut BaseProducer<BatchDescriptor>,
    n: u64,
    k: u64,
    marks: &mut Marks,
) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT * 30;
    let mut i = 0;
    let mut mark_at = SAMPLE_EVERY;
    while i < n {
        let k = k.min(n - i);
        prod.push_batch(k, deadline, item)?;
        i += k;
        if i >= mark_at {
            marks.mark(i);
            mark_at += SAMPLE_EVERY;
        }
    }
    Ok(())
}

/// Ping-pong results: one-way latencies (round trip / 2) in ns, sorted.
pub struct PingPong {
    pub one_way_ns: Vec<u64>,
    pub pairs: u64,
    pub pairs_distinct: u64,
}

impl PingPong {
    pub fn p(&self, pct: f64) -> f64 {
        percentile(&self.one_way_ns, pct).map_or(f64::NAN, |v| v as f64)
    }

    pub fn distinct_pct(&self) -> f64 {
        if self.pairs == 0 {
            f64::NAN
        } else {
            100.0 * self.pairs_distinct as f64 / self.pairs as f64
        }
    }
}

/// Runs one ping-pong; `parked` selects spin = 0 and a gap between pings.
pub fn ping_pong(
    kind: Kind,
    parked: bool,
    samples: usize,
    o: &Options,
    run_no: u64,
) -> Result<PingPong> {
    let warmup = (samples / 10).max(100);
    let total = warmup + samples;
    let epoch = new_epoch(run_no);
    let cpu_every: usize = if parked { 8 } else { 1024 };
    let args = vec![
        "pp".to_owned(),
        kind.name(),
        if parked { "parked" } else { "spin" }.to_owned(),
        total.to_string(),
        epoch.to_string(),
        cpu_every.to_string(),
    ];
    let gap = if parked { o.gap } else { Duration::ZERO };
    let mut rtts = Vec::with_capacity(samples);
    let (mut pairs, mut pairs_distinct) = (0u64, 0u64);
    let mut record = |i: usize, rtt: Duration, peer_cpu: u64| {
        if i >= warmup {
            rtts.push(rtt.as_nanos() as u64);
        }
        if peer_cpu != NO_CPU {
            if let Some(mine) = current_cpu() {
                pairs += 1;
                pairs_distinct += u64::from(u64::from(mine) != peer_cpu);
            }
        }
    };
    match kind {
        Kind::Granary => {
            let (mut seg, fd) = granary_segment(PING_CAPACITY, PING_CAPACITY, epoch)?;
            let (mut ping, mut pong) = seg.take_endpoints().ok_or("endpoints already taken")?;
            let spin = if parked { Duration::ZERO } else { LONG_SPIN };
            ping.set_spin(spin);
            pong.set_spin(spin);
            let mut peer = Peer::spawn(fd, &args)?;
            peer.expect("ready")?;
            for i in 0..total {
                pause(gap);
                let t0 = Instant::now();
                if !ping.try_push(item(i as u64))? {
                    return Err("ping ring full".into());
                }
                let r = pong.pop_blocking(Some(TIMEOUT))?;
                let rtt = t0.elapsed();
                if r.seq != i as u64 {
                    return Err(format!("pong {} for ping {i}", r.seq).into());
                }
                record(i, rtt, r.token);
            }
            peer.expect("done")?;
            peer.finish()?;
        }
        Kind::Baseline(_) | Kind::MinRing => {
            if parked {
                return Err("the baseline ring cannot park".into());
            }
            let cap = PING_CAPACITY as usize;
            let second = second_ring_offset::<BatchDescriptor>(cap);
            let (region, fd) =
                baseline_memory(second + baseline::ring_bytes::<ReleaseDescriptor>(cap))?;
            // SAFETY: fresh zeroed memfd; the parent owns the only producer of
            // ring 0, the peer its only consumer.
            let mut ping = unsafe { baseline::producer::<BatchDescriptor>(region.clone(), 0, cap) };
            // SAFETY: the parent owns the only consumer of ring 1, the peer its
            // only producer.
            let mut pong = unsafe { baseline::consumer::<ReleaseDescriptor>(region, second, cap) };
            let mut peer = Peer::spawn(fd, &args)?;
            peer.expect("ready")?;
            let deadline = Instant::now() + TIMEOUT * 30;
            let mut one = [ReleaseDescriptor::default()];
            for i in 0..total {
                let t0 = Instant::now();
                ping.push_batch(1, deadline, |_| item(i as u64))?;
                while pong.pop_into(&mut one) == 0 {
                    pong.wait_for_data(deadline)?;
                }
                let rtt = t0.elapsed();
                if one[0].seq != i as u64 {
                    return Err(format!("pong {} for ping {i}", one[0].seq).into());
                }
                record(i, rtt, one[0].token);
            }
            peer.expect("done")?;
            peer.finish()?;
        }
    }
    let mut one_way_ns: Vec<u64> = rtts.iter().map(|r| r / 2).collect();
    one_way_ns.sort_unstable();
    Ok(PingPong {
        one_way_ns,
        pairs,
        pairs_distinct,
    })
}

/// Busy-waits `d` (keeps this CPU awake, unlike a sleep, so only the peer parks).
pub fn pause(d: Duration) {
    if d.is_zero() {
        return;
    }
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// Every throughput run, by publication mode (`k`) and ring name, and the
/// distance probe of each repetition.
pub struct Throughput {
    /// The runs of each case.
    pub runs: BTreeMap<(u64, String), Vec<Run>>,
    /// Each repetition's distance probe, ns one-way (p50).
    pub probes: Vec<f64>,
    /// The last run number used.
    pub run_no: u64,
}

/// `--reps` repetitions of every ring in every mode, each repetition after a
/// distance probe; the order rotates between repetitions.
pub fn throughput(o: &Options, modes: &[Publish], kinds: &[Kind], want: u64) -> Result<Throughput> {
    let mut tp = Throughput {
        runs: BTreeMap::new(),
        probes: Vec::new(),
        run_no: 0,
    };
    for rep in 0..o.reps {
        // How far apart the two CPUs are right now: a short spinning
        // ping-pong over the baseline ring (the hypervisor may move vCPUs).
        tp.run_no += 1;
        let probe = ping_pong(BASELINE, false, PROBE_SAMPLES, o, tp.run_no)?.p(50.0);
        println!(
            "  rep {} distance probe: {probe:.0} ns one-way ({})",
            rep + 1,
            if probe < NEAR_NS { "near" } else { "far" }
        );
        tp.probes.push(probe);
        for &publish in modes {
            // Rotate the order every repetition so slow drift hits every kind.
            let mut order = kinds.to_vec();
            order.rotate_left(rep % kinds.len());
            for kind in order {
                tp.run_no += 1;
                let mut r = throughput_run(kind, publish, o, tp.run_no, want)?;
                r.near = probe < NEAR_NS;
                print_run(rep, publish, kind, &r);
                tp.runs
                    .entry((publish.k(), kind.name()))
                    .or_default()
                    .push(r);
            }
        }
    }
    Ok(tp)
}

/// The hand-off latencies: granary's ring spinning and parked, the baseline
/// ring spinning.
pub struct Latency {
    /// Granary's ring, spinning waits.
    pub spin: PingPong,
    /// The baseline ring, spinning waits.
    pub base_spin: PingPong,
    /// Granary's ring, parked waits.
    pub parked: PingPong,
}

/// The three ping-pongs, numbered after `run_no`.
pub fn latency(o: &Options, run_no: u64) -> Result<Latency> {
    println!(
        "  hand-off latency (round trip / 2): {} spinning samples, {} parked samples (gap {} us)",
        o.spin_samples,
        o.parked_samples,
        o.gap.as_micros()
    );
    let l = Latency {
        spin: ping_pong(Kind::Granary, false, o.spin_samples, o, run_no + 1)?,
        base_spin: ping_pong(BASELINE, false, o.spin_samples, o, run_no + 2)?,
        parked: ping_pong(Kind::Granary, true, o.parked_samples, o, run_no + 3)?,
    };
    print_latency(&l);
    Ok(l)
}

/// One throughput run.
pub fn print_run(rep: usize, publish: Publish, kind: Kind, r: &Run) {
    println!(
        "  rep {} {:<13} {:<28} {:>8.2} ns/item ({:>6.2} slice median) [{}; producer {}; consumer {}; producer waits (full) {}, consumer waits (empty) {}]",
        rep + 1,
        publish.label(),
        kind.name(),
        r.ns_per_item,
        r.slice_ns_per_item,
        r.placement,
        r.parent_cpus,
        r.peer_cpus,
        r.full_waits,
        r.empty_polls
    );
}

/// The three hand-off latencies.
pub fn print_latency(l: &Latency) {
    for (label, pp, unit, div) in [
        ("granary  spinning", &l.spin, "ns", 1.0),
        ("baseline spinning", &l.base_spin, "ns", 1.0),
        ("granary  parked", &l.parked, "us", 1e3),
    ] {
        println!(
            "    {label:<18} p50 {:>8.2} {unit}  p99 {:>8.2} {unit}  [distinct CPUs in {:.0}% of {} sampled hand-offs]",
            pp.p(50.0) / div,
            pp.p(99.0) / div,
            pp.distinct_pct(),
            pp.pairs
        );
    }
}

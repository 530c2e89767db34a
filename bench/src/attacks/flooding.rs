//! Attack 4: floods of connections and requests, judged on the agent's
//! memory, its loaders' rate, a legitimate peer's service and the log.

use super::*;

/// What every flood is judged on.
pub(super) struct FloodFigures {
    pub(super) rss0: Rss,
    pub(super) peak: Rss,
    pub(super) after: Rss,
    pub(super) log_bytes: u64,
    pub(super) rejected: Vec<(String, u64)>,
    /// Per A loader: batches/s before and during, longest wait during.
    pub(super) loaders: Vec<(String, f64, f64, Duration)>,
    pub(super) loader_errors: usize,
    /// Probes: time to the first block (None: none within 10 s), wrong blocks.
    pub(super) probes: Vec<(Option<Duration>, usize, Option<String>)>,
    /// Samples the real B got from peers during the flood.
    pub(super) b_peer_samples: f64,
    pub(super) seconds: f64,
    /// How long after the flood `after` was taken.
    pub(super) settle: Duration,
}

pub(super) fn flood<T: Send>(
    ctx: &Ctx,
    pair: &Pair,
    kept: &[u64],
    dur: Duration,
    attack: impl FnOnce(&AtomicBool) -> T + Send,
) -> (T, FloodFigures) {
    let t0 = Instant::now();
    std::thread::sleep(ctx.opts.before());
    let t1 = Instant::now();
    let rss0 = pair.a.rss();
    let log0 = pair.a.log_bytes();
    let s0 = pair.a.series();
    let b0 = sum_of(
        &pair.b.series(),
        "granary_tier_samples_total",
        "tier=\"peer\"",
    );
    let errors0: usize = pair.a_loaders().map(|l| l.stats.error_count()).sum();
    let stop = AtomicBool::new(false);
    let stop_watch = AtomicBool::new(false);
    let pid = pair.a.pid();
    let (out, peak, probes) = std::thread::scope(|s| {
        let attacker = s.spawn(|| attack(&stop));
        let watcher = s.spawn(|| {
            let mut peak = Rss::default();
            while !stop_watch.load(Ordering::Relaxed) {
                let now = crate::attack_agent::rss_of(pid);
                peak.total = peak.total.max(now.total);
                peak.anon = peak.anon.max(now.anon);
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        let prober = s.spawn(|| {
            let mut out = Vec::new();
            floods::sleep_until_stop(&stop, Duration::from_secs(1));
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let ids: Vec<u64> = (0..4).map(|i| kept[(k + i * 7) % kept.len()]).collect();
                k += 1;
                let f = legit_fetch(ctx, pair, &ids, Duration::from_secs(10));
                out.push((f.first_block, f.wrong, f.error));
                floods::sleep_until_stop(&stop, Duration::from_secs(1));
            }
            out
        });
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        let out = attacker.join();
        let probes = prober.join().unwrap_or_default();
        stop_watch.store(true, Ordering::Relaxed);
        let peak = watcher.join().unwrap_or_default();
        (out, peak, probes)
    });
    let out = match out {
        Ok(o) => o,
        Err(_) => panic!("an attack thread panicked"),
    };
    let t2 = Instant::now();
    let s1 = pair.a.series();
    let log_bytes = pair.a.log_bytes().saturating_sub(log0);
    let b1 = sum_of(
        &pair.b.series(),
        "granary_tier_samples_total",
        "tier=\"peer\"",
    );
    let loaders = pair
        .a_loaders()
        .map(|l| {
            let (nb, _) = l.stats.window(t0, t1);
            let (nd, longest) = l.stats.window(t1, t2);
            (
                l.name.clone(),
                nb as f64 / (t1 - t0).as_secs_f64(),
                nd as f64 / (t2 - t1).as_secs_f64(),
                longest,
            )
        })
        .collect();
    let loader_errors = pair
        .a_loaders()
        .map(|l| l.stats.error_count())
        .sum::<usize>()
        - errors0;
    std::thread::sleep(ctx.opts.settle());
    let after = pair.a.rss();
    let peak = Rss {
        total: peak.total.max(rss0.total),
        anon: peak.anon.max(rss0.anon),
    };
    (
        out,
        FloodFigures {
            rss0,
            peak,
            after,
            log_bytes,
            rejected: rejected_delta(&s0, &s1),
            loaders,
            loader_errors,
            probes,
            b_peer_samples: b1 - b0,
            seconds: (t2 - t1).as_secs_f64(),
            settle: ctx.opts.settle(),
        },
    )
}

pub(super) const MIB: f64 = (1 << 20) as f64;

/// Prints and judges a flood's figures; returns its JSON fields.
pub(super) fn judge(name: &str, f: &FloodFigures, r: &mut Report) -> Json {
    let grew = f.peak.total.saturating_sub(f.rss0.total);
    println!(
        "  A's memory: {:.1} MiB before, {:.1} MiB at the peak (+{:.1} MiB; anonymous {:.1} -> {:.1} \
         MiB), {:.1} MiB {:.0} s after",
        f.rss0.total as f64 / MIB,
        f.peak.total as f64 / MIB,
        grew as f64 / MIB,
        f.rss0.anon as f64 / MIB,
        f.peak.anon as f64 / MIB,
        f.after.total as f64 / MIB,
        f.settle.as_secs_f64()
    );
    for (l, before, during, longest) in &f.loaders {
        println!(
            "  loader {l}: {before:.1} batches/s before, {during:.1} during; longest wait during \
             {:.2} s",
            longest.as_secs_f64()
        );
    }
    let ok_probes = f
        .probes
        .iter()
        .filter(|(d, w, _)| d.is_some_and(|d| d <= PEER_BOUND) && *w == 0)
        .count();
    let worst = f
        .probes
        .iter()
        .map(|(d, _, _)| d.map_or(f64::INFINITY, |d| d.as_secs_f64()))
        .fold(0.0f64, f64::max);
    let wrong: usize = f.probes.iter().map(|(_, w, _)| w).sum();
    let failures: Vec<&str> = f
        .probes
        .iter()
        .filter(|(d, _, _)| d.is_none())
        .filter_map(|(_, _, e)| e.as_deref())
        .collect();
    println!(
        "  legitimate peer (member p, from 127.0.0.11): {ok_probes} of {} fetches had a block within \
         5 s, the slowest after {worst:.2} s{}; the real B took {} samples from peers meanwhile",
        f.probes.len(),
        failures
            .first()
            .map(|e| format!(" (a failed one: {e})"))
            .unwrap_or_default(),
        f.b_peer_samples
    );
    println!(
        "  A's log grew {} bytes; rejected: {}",
        f.log_bytes,
        words(&f.rejected)
    );
    r.check(
        Goal::Floods,
        grew <= RSS_BOUND,
        format!(
            "{name}: A's memory +{:.1} MiB (bound 128 MiB)",
            grew as f64 / MIB
        ),
    );
    let served = f.loader_errors == 0
        && f.loaders
            .iter()
            .all(|(_, _, during, longest)| *during > 0.0 && *longest <= SERVED_BOUND);
    r.check(
        Goal::Floods,
        served,
        format!(
            "{name}: A's loaders kept being served ({} errors, longest wait {:.2} s, bound {} s)",
            f.loader_errors,
            f.loaders
                .iter()
                .map(|l| l.3.as_secs_f64())
                .fold(0.0, f64::max),
            SERVED_BOUND.as_secs()
        ),
    );
    r.check(
        Goal::Floods,
        !f.probes.is_empty() && ok_probes == f.probes.len(),
        format!(
            "{name}: a legitimate peer got blocks within 5 s in {ok_probes} of {} tries (slowest \
             {worst:.2} s)",
            f.probes.len()
        ),
    );
    r.check(
        Goal::Clear,
        wrong == 0,
        format!("{name}: the legitimate peer got {wrong} wrong blocks"),
    );
    let mut j = Json::default();
    j.num("seconds", f.seconds, 1)
        .int("rss_before", f.rss0.total)
        .int("rss_peak", f.peak.total)
        .int("rss_after", f.after.total)
        .int("anon_before", f.rss0.anon)
        .int("anon_peak", f.peak.anon)
        .num("rss_growth_mib", grew as f64 / MIB, 1)
        .nums(
            "loader_batches_per_s_before",
            &f.loaders.iter().map(|l| l.1).collect::<Vec<_>>(),
            2,
        )
        .nums(
            "loader_batches_per_s_during",
            &f.loaders.iter().map(|l| l.2).collect::<Vec<_>>(),
            2,
        )
        .num(
            "loader_longest_wait_s",
            f.loaders
                .iter()
                .map(|l| l.3.as_secs_f64())
                .fold(0.0, f64::max),
            2,
        )
        .int("loader_errors", f.loader_errors as u64)
        .int("peer_tries", f.probes.len() as u64)
        .int("peer_tries_within_5s", ok_probes as u64)
        .num("peer_slowest_s", worst, 2)
        .num("b_peer_samples", f.b_peer_samples, 0)
        .int("log_bytes", f.log_bytes)
        .raw("rejected", &rejected_json(&f.rejected));
    j
}

pub(super) fn run_floods(
    ctx: &Ctx,
    pair: &Pair,
    paths: &Paths,
    kept: &[u64],
    r: &mut Report,
) -> Result<()> {
    let dur = ctx.opts.attack;
    let mut all = Json::default();
    let member = pair.member("p", Some("a"));
    let kept_gets = gets_of(ctx, pair.fingerprint, kept, 1);

    for refill in [false, true] {
        let n = ctx.opts.flood;
        let name = if refill {
            "4a'. connection flood, refilled"
        } else {
            "4a. connection flood"
        };
        println!(
            "\n== {name}: {n} unauthenticated connections from {} source IPs (127.0.1.x), opened \
             as fast as possible, held open and silent for {} s{}",
            ctx.opts.flood_ips,
            dur.as_secs(),
            if refill {
                "; each one A closes is opened again at once"
            } else {
                ""
            }
        );
        let (c, f) = flood(ctx, pair, kept, dur, |stop| {
            floods::conn_flood(pair.a_peer, n, ctx.opts.flood_ips, refill, stop)
        });
        println!(
            "  opened {} ({} failed at once) in {:.2} s for the first {n}; A closed {}; {} bytes \
             came back; most held open at once {}",
            c.opened,
            c.failed,
            c.open_time.as_secs_f64(),
            c.closed_by_agent,
            c.received,
            c.peak_open
        );
        let mut j = judge(name, &f, r);
        r.check(
            Goal::Clear,
            c.received == 0,
            format!("{name}: {} bytes sent to the flooding stranger", c.received),
        );
        j.int("opened", c.opened)
            .int("failed", c.failed)
            .int("closed_by_agent", c.closed_by_agent)
            .int("received", c.received)
            .num("open_time_s", c.open_time.as_secs_f64(), 2);
        all.raw(
            if refill {
                "conn_flood_refill"
            } else {
                "conn_flood"
            },
            &j.line(),
        );
    }

    let dur_nr = dur.max(ctx.opts.write_timeout() + Duration::from_secs(2));
    println!(
        "\n== 4b. six authenticated connections (the secret and p's id, from 127.0.0.6) that ask \
         for A's kept samples and never read, for {} s; a closed one is replaced",
        dur_nr.as_secs()
    );
    let (n, f) = flood(ctx, pair, kept, dur_nr, |stop| {
        floods::non_readers(pair.a_peer, ip(MEMBER_IP), &member, 6, &kept_gets, stop)
    });
    println!(
        "  {} connections, {} gets sent, {} found closed by A, {} dials failed",
        n.connections, n.gets, n.closed_by_agent, n.failed_dials
    );
    let mut j = judge("4b. non-reading peers", &f, r);
    j.int("connections", n.connections)
        .int("gets", n.gets)
        .int("closed_by_agent", n.closed_by_agent);
    all.raw("non_readers", &j.line());

    let every = Duration::from_secs(5);
    println!(
        "\n== 4c. an authenticated \"owner\": B's view address now leads to an attacker (127.0.0.5) \
         holding the secret, which answers A's first get on each connection with a block trickled \
         one byte every {} s, for {} s",
        every.as_secs(),
        dur.as_secs().max(3 * ctx.opts.block_timeout().as_secs())
    );
    let owner =
        TcpListener::bind(SocketAddr::new(ip(OWNER_IP), 0)).map_err(|e| format!("owner: {e}"))?;
    let owner_addr = owner.local_addr().map_err(|e| e.to_string())?;
    let owner_cfg = pair.member("b", None);
    let content = |id: u64| ctx.windows.content(id).to_vec();
    let dur_t = dur.max(3 * ctx.opts.block_timeout());
    let (t, f) = flood(ctx, pair, kept, dur_t, |stop| {
        // A's dials to B reach the attacker; B's dials to A are refused, so
        // the attacker is the only B that A can ask.
        paths.to_b.set(owner_addr, false);
        paths.to_a.refuse();
        let t = floods::trickle_owner(&owner, &owner_cfg, pair.fingerprint, &content, every, stop);
        paths.forward(pair, false);
        t
    });
    let slowest = t
        .abandoned_after
        .iter()
        .map(Duration::as_secs_f64)
        .fold(0.0, f64::max);
    println!(
        "  A dialled the attacker {} times and asked {} samples; {} blocks trickled ({} bytes); A \
         abandoned them after {:?} s",
        t.connections,
        t.requests,
        t.blocks,
        t.bytes,
        t.abandoned_after
            .iter()
            .map(|d| (d.as_secs_f64() * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    );
    let bound = ctx.opts.block_timeout() + Duration::from_secs(1);
    r.check(
        Goal::Floods,
        !t.abandoned_after.is_empty() && slowest <= bound.as_secs_f64(),
        format!(
            "4c. trickle: A abandoned {} trickled blocks, the slowest after {slowest:.2} s \
             (peers.block_timeout_ms = {} ms, 1 s allowed beyond)",
            t.abandoned_after.len(),
            ctx.opts.block_timeout().as_millis()
        ),
    );
    let mut j = judge("4c. trickling owner", &f, r);
    j.int("connections", t.connections)
        .int("requests", t.requests)
        .int("blocks", t.blocks)
        .int("bytes", t.bytes)
        .nums(
            "abandoned_after_s",
            &t.abandoned_after
                .iter()
                .map(Duration::as_secs_f64)
                .collect::<Vec<_>>(),
            2,
        );
    all.raw("trickle", &j.line());

    let dur_p = dur.max(Duration::from_secs(if ctx.opts.smoke { 3 } else { 10 }));
    println!(
        "\n== 4d. pings as fast as they can be written on an authenticated connection that never \
         reads, for {} s",
        dur_p.as_secs()
    );
    let (p, f) = flood(ctx, pair, kept, dur_p, |stop| {
        floods::ping_flood(pair.a_peer, ip(MEMBER_IP), &member, stop)
    });
    println!(
        "  {} pings ({:.1} MB) on {} connections",
        p.pings,
        p.bytes as f64 / 1e6,
        p.connections
    );
    let mut j = judge("4d. pings", &f, r);
    j.int("pings", p.pings)
        .int("bytes", p.bytes)
        .int("connections", p.connections);
    all.raw("pings", &j.line());

    let dur_r = Duration::from_secs(if ctx.opts.smoke { 3 } else { 5 });
    println!(
        "\n== 4e. one request id sent over and over for {} s (an authenticated peer that reads)",
        dur_r.as_secs()
    );
    let get = Get {
        request: 7,
        ..kept_gets[0]
    };
    let (u, f) = flood(ctx, pair, kept, dur_r, |stop| {
        floods::reuse_request_id(
            pair.a_peer,
            ip(MEMBER_IP),
            &member,
            get,
            pair.fingerprint,
            stop,
        )
    });
    let u = u.unwrap_or_default();
    let reused = f
        .rejected
        .iter()
        .find(|(k, _)| k == "request_id")
        .map_or(0, |(_, v)| *v);
    println!(
        "  {} gets with request id 7 ({} answered, {} blocks); A counted {reused} reuses; its log \
         grew {} bytes (the old code: 21.8 MB in 5 s)",
        u.gets, u.answers, u.blocks, f.log_bytes
    );
    r.check(
        Goal::Floods,
        f.log_bytes <= LOG_BOUND && reused > 0,
        format!(
            "4e. reused request id: {reused} reuses wrote {} log bytes (bound 1 MiB)",
            f.log_bytes
        ),
    );
    let mut j = judge("4e. reused request id", &f, r);
    j.int("gets", u.gets)
        .int("answers", u.answers)
        .int("reuses_counted", reused);
    all.raw("reused_id", &j.line());
    r.section("floods", &all);
    Ok(())
}

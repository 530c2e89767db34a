//! Attack 2: relays: a splice between the two agents, a tap on their
//! path, and a corrupting relay.

use super::*;

/// Copies `from` to `to`, counting; stops at the end of either.
pub(super) fn pipe(mut from: TcpStream, mut to: TcpStream, count: Arc<AtomicU64>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                count.fetch_add(n as u64, Ordering::Relaxed);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

pub(super) fn splice(ctx: &Ctx, pair: &Pair, paths: &Paths, r: &mut Report) -> Result<()> {
    println!("\n== 2. relays without the secret");
    let mut j = Json::default();
    // (a) Dial both agents and join the two connections.
    let (sa0, sb0) = (pair.a.series(), pair.b.series());
    let to_a = peer_client::connect(pair.a_peer, Some(ip(SPLICE_IP)), None, false)
        .map_err(|e| format!("splice: {e}"))?;
    let to_b = peer_client::connect(pair.b_peer, Some(ip(SPLICE_IP)), None, false)
        .map_err(|e| format!("splice: {e}"))?;
    let (a_said, b_said) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let t = Instant::now();
    let threads = [
        {
            let (f, to, c) = (
                to_a.try_clone().map_err(|e| e.to_string())?,
                to_b.try_clone().map_err(|e| e.to_string())?,
                Arc::clone(&a_said),
            );
            std::thread::spawn(move || pipe(f, to, c))
        },
        {
            let (f, to, c) = (to_b, to_a, Arc::clone(&b_said));
            std::thread::spawn(move || pipe(f, to, c))
        },
    ];
    for th in threads {
        let _ = th.join();
    }
    let secs = t.elapsed().as_secs_f64();
    let (da, db) = (
        rejected_delta(&sa0, &pair.a.series()),
        rejected_delta(&sb0, &pair.b.series()),
    );
    let (a_said, b_said) = (
        a_said.load(Ordering::Relaxed),
        b_said.load(Ordering::Relaxed),
    );
    println!(
        "  splice of two accepted connections: A said {a_said} B, B said {b_said} B; both closed \
         after {secs:.2} s (A rejected: {}; B rejected: {})",
        words(&da),
        words(&db)
    );
    r.check(
        Goal::Clear,
        a_said == 0 && b_said == 0,
        format!(
            "a splice of A's and B's listeners carries {} bytes",
            a_said + b_said
        ),
    );
    j.raw(
        "splice",
        &Json::default()
            .int("a_bytes", a_said)
            .int("b_bytes", b_said)
            .num("closed_after_s", secs, 2)
            .raw("a_rejected", &rejected_json(&da))
            .raw("b_rejected", &rejected_json(&db))
            .line(),
    );
    // (b) A dialer's opening, recorded on the path, replayed to B and to A.
    paths.forward(pair, true);
    let end = Instant::now() + Duration::from_secs(15);
    let opening = loop {
        if let Some(o) = paths.take().openings.into_iter().next() {
            break o;
        }
        if Instant::now() > end {
            return Err("neither A nor B dialled the other in 15 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    paths.forward(pair, false);
    let mut forged = opening.clone();
    forged.extend_from_slice(&200u16.to_be_bytes());
    forged.extend_from_slice(&random_bytes(200));
    let mut found = BTreeSet::new();
    // The real connections, cut above, come up again first: what comes up
    // during a replay is the replay.
    std::thread::sleep(Duration::from_secs(3));
    for (who, to, agent) in [("B", pair.b_peer, &pair.b), ("A", pair.a_peer, &pair.a)] {
        let before = agent.series();
        let log0 = agent.log_bytes();
        let p = peer_client::stranger(to, Some(ip(SPLICE_IP)), &forged, Duration::from_secs(5))
            .map_err(|e| format!("replay: {e}"))?;
        let d = rejected_delta(&before, &agent.series());
        std::thread::sleep(Duration::from_millis(200));
        let ups = agent.log_since(log0).matches("peer connection up").count();
        found.extend(ctx.windows.found_in(&p.received));
        println!(
            "  a recorded opening ({} B) replayed to {who} with a forged record: got {} B back \
             (its handshake answer; no key to read it), {} samples in clear; {who} took it for \
             the member {ups} times (\"peer connection up\"); rejected: {}",
            opening.len(),
            p.received.len(),
            ctx.windows.found_in(&p.received).len(),
            words(&d)
        );
        j.raw(
            &format!("replay_to_{}", who.to_lowercase()),
            &Json::default()
                .int("received", p.received.len() as u64)
                .int("taken_for_the_member", ups as u64)
                .int(
                    "samples_in_clear",
                    ctx.windows.found_in(&p.received).len() as u64,
                )
                .raw("rejected", &rejected_json(&d))
                .line(),
        );
    }
    r.check(
        Goal::Clear,
        found.is_empty(),
        format!(
            "replays of a recorded handshake read {} samples in clear",
            found.len()
        ),
    );
    r.section("splice", &j);
    Ok(())
}

/// Records A's path to B for a while: what crossed, and the samples found
/// in it in clear.
pub(super) fn tap(
    ctx: &Ctx,
    pair: &Pair,
    paths: &Paths,
    r: &mut Report,
    what: &str,
) -> (Json, usize) {
    let secs = if ctx.opts.smoke { 4 } else { 8 };
    println!(
        "\n== 3. {what}: the forwarding proxies on the path between A and B record everything \
         for {secs} s"
    );
    let (_, p0, _) = tiers(&pair.a);
    let wrong0 = wrong_total(ctx, pair);
    paths.forward(pair, true);
    std::thread::sleep(Duration::from_secs(secs));
    let cap = paths.take();
    paths.forward(pair, false);
    let (_, p1, _) = tiers(&pair.a);
    let mut found = ctx.windows.found_in(&cap.to_dialer);
    found.extend(ctx.windows.found_in(&cap.to_upstream));
    let wrong = wrong_total(ctx, pair) - wrong0;
    println!(
        "  captured {} B from listeners to dialers and {} B the other way ({} connections); A \
         got {} samples from peers meanwhile; samples found in clear: {}",
        cap.to_dialer.len(),
        cap.to_upstream.len(),
        cap.openings.len(),
        p1 - p0,
        found.len()
    );
    if pair.protection == Protection::Encrypted {
        r.check(
            Goal::Clear,
            found.is_empty() && wrong == 0,
            format!(
                "the tap reads {} samples in clear while {} samples crossed ({wrong} wrong samples)",
                found.len(),
                p1 - p0
            ),
        );
        r.check(
            Goal::Clear,
            p1 > p0,
            format!(
                "samples crossed the tapped path ({}), so the tap was tested",
                p1 - p0
            ),
        );
    }
    let mut j = Json::default();
    j.int("seconds", secs)
        .int("bytes_to_dialers", cap.to_dialer.len() as u64)
        .int("bytes_to_listeners", cap.to_upstream.len() as u64)
        .int("peer_samples", (p1 - p0) as u64)
        .int("samples_in_clear", found.len() as u64);
    (j, found.len())
}

pub(super) fn wrong_total(ctx: &Ctx, pair: &Pair) -> u64 {
    pair.loaders
        .iter()
        .chain(ctx.retired.iter())
        .map(|l| l.stats.wrong.load(Ordering::Relaxed))
        .sum()
}

pub(super) fn relay(ctx: &Ctx, pair: &Pair, paths: &Paths, r: &mut Report) -> Result<()> {
    let secs = if ctx.opts.smoke { 4 } else { 8 };
    println!(
        "\n== 2c. relays on the path between A and B that replace payload bytes (a byte of every \
         block record) for {secs} s"
    );
    let corrupt = |to: SocketAddr| {
        CorruptingProxy::start(
            SocketAddr::new(ip(SWITCH_B_IP), 0),
            to,
            Corrupt::Every { every: 1, first: 0 },
        )
        .map_err(|e| format!("relay: {e}"))
    };
    let (to_a, to_b) = (corrupt(pair.a_peer)?, corrupt(pair.b_peer)?);
    let wrong0 = wrong_total(ctx, pair);
    paths.to_a.set(to_a.addr(), true);
    paths.to_b.set(to_b.addr(), true);
    // Blocks that crossed the honest connections just before the cut are
    // counted by A a moment later: the baseline is read once they have
    // settled, so only what crossed the relays is weighed.
    std::thread::sleep(Duration::from_millis(500));
    let s0 = pair.a.series();
    std::thread::sleep(Duration::from_secs(secs));
    let cap = paths.take();
    paths.forward(pair, false);
    let (blocks, changed) = (
        to_a.blocks() + to_b.blocks(),
        to_a.corrupted() + to_b.corrupted(),
    );
    let s1 = pair.a.series();
    let wrong = wrong_total(ctx, pair) - wrong0;
    let d = rejected_delta(&s0, &s1);
    let peer = sum_of(&s1, "granary_tier_samples_total", "tier=\"peer\"")
        - sum_of(&s0, "granary_tier_samples_total", "tier=\"peer\"");
    let crc = sum_of(&s1, "granary_peer_crc_failures_total", "")
        - sum_of(&s0, "granary_peer_crc_failures_total", "");
    let mut found = ctx.windows.found_in(&cap.to_dialer);
    found.extend(ctx.windows.found_in(&cap.to_upstream));
    println!(
        "  the relays saw {blocks} block records and changed {changed}; A rejected: {}; block CRC \
         failures {crc}; samples A took from peers meanwhile {peer}; wrong samples delivered \
         {wrong}; samples in clear on the path {}",
        words(&d),
        found.len()
    );
    r.check(
        Goal::Clear,
        wrong == 0 && found.is_empty() && peer == 0.0,
        format!(
            "relays changing {changed} records caused {wrong} wrong samples, {peer} samples \
             accepted from them, and read {} samples in clear",
            found.len()
        ),
    );
    r.check(
        Goal::Clear,
        changed > 0,
        format!("the relays changed {changed} block records, so the attack was tested"),
    );
    let mut j = Json::default();
    j.int("seconds", secs)
        .int("block_records", blocks)
        .int("changed", changed)
        .int("wrong_samples", wrong)
        .int("peer_samples_accepted", peer as u64)
        .int("crc_failures", crc as u64)
        .int("samples_in_clear", found.len() as u64)
        .raw("rejected", &rejected_json(&d));
    r.section("relay", &j);
    Ok(())
}

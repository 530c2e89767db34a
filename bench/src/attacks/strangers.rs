//! Attacks 1 and 6: strangers dialing the agent, with garbage, old
//! formats, replayed openings and wrong secrets.

use super::*;

pub(super) fn random_bytes(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        out.extend_from_slice(&peer_client::entropy());
    }
    out.truncate(n);
    out
}

/// A hello as format 1 framed it: frame version 1, protocol version 1, in
/// clear.
pub(super) fn format1_hello(digest: [u8; 32]) -> Vec<u8> {
    let mut b = Frame::Hello(Hello {
        version: PROTOCOL_VERSION,
        job_id: JOB.into(),
        node_id: "b".into(),
        view_digest: digest,
        incarnation: 7,
    })
    .to_bytes()
    .unwrap_or_default();
    if b.len() > 10 {
        b[0] = 1;
        b[8..10].copy_from_slice(&1u16.to_le_bytes());
    }
    b
}

/// The bytes a dialer with `cfg` sends first (preamble and message 1).
pub(super) fn dialer_opening(cfg: ConnConfig) -> Vec<u8> {
    let mut out = Vec::new();
    if let Ok(mut c) = Conn::dial(cfg, peer_client::entropy(), 0) {
        while let Some(Transmit::Bytes(b)) = c.poll_transmit() {
            out.extend_from_slice(&b);
        }
    }
    out
}

pub(super) fn strangers(ctx: &Ctx, pair: &Pair, r: &mut Report) {
    println!(
        "\n== 1. strangers at A's peer port {} (from 127.0.0.9)",
        pair.a_peer
    );
    let preamble = Preamble {
        suite: Suite::fastest_here(),
        protection: Protection::Encrypted,
    }
    .encode()
    .to_vec();
    let mut wrong = pair.member("b", Some("a"));
    wrong.secret = OTHER_SECRET.as_bytes().to_vec();
    let mut wrong_clear = wrong.clone();
    wrong_clear.protection = Protection::Authenticated;
    let mut message = preamble.clone();
    message.extend_from_slice(&96u16.to_be_bytes());
    message.extend_from_slice(&random_bytes(96));
    let mut garbage = preamble.clone();
    garbage.extend_from_slice(&random_bytes(4096));
    let variants: Vec<(&str, Vec<u8>)> = vec![
        ("text", b"GET / HTTP/1.1\r\nHost: granary\r\n\r\n".to_vec()),
        ("format1_hello", format1_hello(pair.digest)),
        ("random", random_bytes(4096)),
        ("preamble_then_garbage", garbage),
        ("preamble_then_random_message", message),
        ("wrong_secret", dialer_opening(wrong.clone())),
        ("wrong_secret_in_clear", dialer_opening(wrong_clear)),
        ("silent", Vec::new()),
    ];
    let mut j = Json::default();
    let mut total = 0usize;
    let mut found = BTreeSet::new();
    let mut all_closed = true;
    for (name, bytes) in &variants {
        let before = pair.a.series();
        let p = peer_client::stranger(
            pair.a_peer,
            Some(ip(STRANGER_IP)),
            bytes,
            Duration::from_secs(6),
        );
        let after = pair.a.series();
        let delta = rejected_delta(&before, &after);
        let words: Vec<String> = delta.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut o = Json::default();
        match p {
            Ok(p) => {
                total += p.received.len();
                found.extend(ctx.windows.found_in(&p.received));
                all_closed &= p.closed;
                println!(
                    "  {name:<30} sent {:>5} B, got back {} B, {}, rejected: {}",
                    bytes.len(),
                    p.received.len(),
                    match p.closed_after {
                        Some(d) => format!("closed after {:.2} s", d.as_secs_f64()),
                        None => "still open after 6 s".into(),
                    },
                    if words.is_empty() {
                        "-".into()
                    } else {
                        words.join(" ")
                    }
                );
                o.int("sent", bytes.len() as u64)
                    .int("received", p.received.len() as u64)
                    .num(
                        "closed_after_s",
                        p.closed_after.map_or(f64::NAN, |d| d.as_secs_f64()),
                        3,
                    );
            }
            Err(e) => {
                println!("  {name:<30} could not connect: {e}");
                o.str("error", &e.to_string());
                all_closed = false;
            }
        }
        o.raw("rejected", &rejected_json(&delta));
        j.raw(name, &o.line());
    }
    r.check(
        Goal::Clear,
        total == 0 && found.is_empty(),
        format!(
            "strangers got {total} bytes back ({} samples in clear) over {} kinds of hello",
            found.len(),
            variants.len()
        ),
    );
    r.check(
        Goal::Clear,
        all_closed,
        "every stranger's connection was closed by A (the silent one at peers.connect_timeout_ms)"
            .into(),
    );
    // 6. the oracle: what a dialer with the wrong secret learns.
    let n = if ctx.opts.smoke { 20 } else { 200 };
    let before = pair.a.series();
    let t = Instant::now();
    let mut oracle_bytes = 0usize;
    for _ in 0..n {
        if let Ok(p) = peer_client::stranger(
            pair.a_peer,
            Some(ip(STRANGER_IP)),
            &dialer_opening(wrong.clone()),
            Duration::from_secs(2),
        ) {
            oracle_bytes += p.received.len();
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let delta = rejected_delta(&before, &pair.a.series());
    println!(
        "  oracle: {n} dialers with a wrong secret got {oracle_bytes} bytes back ({:.0} guesses/s, \
         each an online connection; rejected: {})",
        n as f64 / secs,
        words(&delta)
    );
    r.check(
        Goal::Clear,
        oracle_bytes == 0,
        format!("a dialer with a wrong secret receives {oracle_bytes} bytes: nothing to guess offline against"),
    );
    let mut o = Json::default();
    o.int("dialers", n)
        .int("received", oracle_bytes as u64)
        .num("guesses_per_s", n as f64 / secs, 0)
        .raw("rejected", &rejected_json(&delta));
    r.section("oracle", &o);
    // The log under a stream of strangers.
    let n = if ctx.opts.smoke { 200 } else { 2000 };
    let log0 = pair.a.log_bytes();
    let before = pair.a.series();
    let t = Instant::now();
    for _ in 0..n {
        let _ = peer_client::stranger(
            pair.a_peer,
            Some(ip(STRANGER_IP)),
            b"garbage",
            Duration::from_secs(2),
        );
    }
    let secs = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let grew = pair.a.log_bytes().saturating_sub(log0);
    let delta = rejected_delta(&before, &pair.a.series());
    println!(
        "  {n} garbage connections in {secs:.1} s: A's log grew {grew} bytes ({:.0} bytes a \
         connection); rejected: {}",
        grew as f64 / n as f64,
        words(&delta)
    );
    j.raw(
        "stream",
        &Json::default()
            .int("connections", n)
            .num("seconds", secs, 2)
            .int("log_bytes", grew)
            .raw("rejected", &rejected_json(&delta))
            .line(),
    );
    j.int("received_total", total as u64)
        .int("samples_in_clear", found.len() as u64);
    r.section("strangers", &j);
}

pub(super) fn words(delta: &[(String, u64)]) -> String {
    if delta.is_empty() {
        return "-".into();
    }
    delta
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn rejected_json(delta: &[(String, u64)]) -> String {
    let mut o = Json::default();
    for (k, v) in delta {
        o.int(k, *v);
    }
    o.line()
}

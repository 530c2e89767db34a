//! Attack 5: another uid's views of the agent's sessions.

use super::*;

pub(super) const VIEWS_JOB: &str = "attacks-views";

/// The loader of another uid (re-executed as uid 65534): hands views in and
/// prints what happened, one line each.
pub fn views_child(sock: &Path) -> i32 {
    let wait = Duration::from_secs(10);
    let id = match Client::connect(sock).and_then(|c| c.peer_identity(wait)) {
        Ok(i) => i,
        Err(e) => {
            println!("error identity {e}");
            return 1;
        }
    };
    let me = ViewMember {
        id: id.node_id.clone(),
        addr: id.addr.clone(),
        capacity: id.capacity,
    };
    let relay = ViewMember {
        id: "n1".into(),
        addr: "127.0.0.9:7170".into(),
        capacity: id.capacity,
    };
    let views = [
        ("join", encode_view(VIEWS_JOB, 1, std::slice::from_ref(&me))),
        (
            "relaunch",
            encode_view(VIEWS_JOB, 2, std::slice::from_ref(&me)),
        ),
        ("relay", encode_view(VIEWS_JOB, 2, &[me.clone(), relay])),
    ];
    for (what, v) in views {
        let Ok(v) = v else {
            println!("error encode {what}");
            return 1;
        };
        match Client::connect(sock).and_then(|c| c.join_view(&v, wait)) {
            Ok(j) => println!("{what} accepted installed={}", j.installed),
            Err(e) => println!("{what} refused {:?}", e.code()),
        }
    }
    match Client::connect(sock).and_then(|c| c.peer_identity(wait)) {
        Ok(i) => println!("held {} {}", i.job_id, i.view_epoch),
        Err(e) => println!("error identity {e}"),
    }
    0
}

pub(super) fn views(ctx: &Ctx, r: &mut Report) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    println!(
        "\n== 5. another uid's views: a loader as uid 65534 (admitted by socket.allowed_uids) on \
         agent C (membership = \"session\")"
    );
    let dir = ctx.work.join("views");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for d in [&ctx.work, &dir] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    let sock = dir.join("c.sock");
    let listen = SocketAddr::new(ip(VIEWS_IP), free_port(ip(VIEWS_IP))?);
    let metrics = SocketAddr::new(ip(VIEWS_IP), free_port(ip(VIEWS_IP))?);
    let toml = format!(
        r#"[arena]
size = "64MiB"
hugepages = "off"
[prefetch]
max_inflight_reads = 32
[socket]
path = "{sock}"
mode = "0777"
allowed_uids = [65534]
[metrics]
address = "{metrics}"
[peers]
membership = "session"
node_id = "c"
listen = "{listen}"
secret = "{SECRET}"
[[dataset]]
name = "{DATASET}"
root = "{root}"
"#,
        sock = sock.display(),
        root = ctx.spec.root.display()
    );
    let c = AgentProc::start(&ctx.bin, "C", &dir, &toml, &sock, metrics, None)?;
    // The owner installs the job's view and reads.
    let id = Client::connect(&sock)
        .and_then(|c| c.peer_identity(Duration::from_secs(10)))
        .map_err(|e| format!("C: {e}"))?;
    let me = ViewMember {
        id: id.node_id,
        addr: id.addr,
        capacity: id.capacity,
    };
    let v1 = encode_view(VIEWS_JOB, 1, &[me]).map_err(|e| e.to_string())?;
    let mut o = SessionOptions::new(DATASET);
    o.view = Some(v1);
    o.view_required = true;
    o.batch_size = 8;
    let mut s = Client::connect(&sock)
        .and_then(|cl| cl.open_session(&o))
        .map_err(|e| format!("the owner's session: {e}"))?;
    let installed = matches!(s.view_status(), Some(Ok(j)) if j.installed);
    let mut got = 0u64;
    let mut wrong = 0u64;
    let mut read = |b: &granary::Batch| {
        for x in b.samples() {
            let right = x.status() == 0
                && synth::verify_sample(&x.to_vec())
                    .is_ok_and(|i| i == ctx.spec.sample_info(x.id()));
            if right {
                got += 1;
            } else {
                wrong += 1;
            }
        }
    };
    let b = s
        .next_batch(Some(Duration::from_secs(30)))
        .map_err(|e| format!("the owner's first batch: {e}"))?;
    read(&b);
    s.release(b).map_err(|e| e.to_string())?;
    let refused0 = c.metric("granary_peer_views_total", "reason=\"uid\"");
    // The other uid's loader.
    let exe = dir.join("attacks-views-loader");
    std::fs::copy(std::env::current_exe().map_err(|e| e.to_string())?, &exe)
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    let mut tries = 0;
    let out = loop {
        let o = std::process::Command::new(&exe)
            .arg("--views-stranger")
            .arg(&sock)
            .current_dir(&dir)
            .uid(65534)
            .gid(65534)
            .stdin(std::process::Stdio::null())
            .output();
        match o {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => break other.map_err(|e| format!("run as uid 65534: {e}"))?,
        }
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for l in text.lines() {
        println!("  uid 65534: {l}");
    }
    let line = |w: &str| {
        text.lines()
            .find(|l| l.starts_with(w))
            .unwrap_or("")
            .to_owned()
    };
    // The owner reads its epoch to the end.
    let mut fenced = None;
    loop {
        match s.next_batch(Some(Duration::from_secs(30))) {
            Ok(b) => {
                read(&b);
                let _ = s.release(b);
            }
            Err(e) if e.code() == ErrorCode::EndOfStream => break,
            Err(e) => {
                fenced = Some(e.to_string());
                break;
            }
        }
    }
    drop(s);
    let series = c.series();
    let refused = sum_of(&series, "granary_peer_views_total", "reason=\"uid\"") - refused0;
    let ended = sum_of(&series, "granary_peer_sessions_ended_by_view_total", "");
    let epoch = sum_of(&series, "granary_peer_view_epoch", "");
    println!(
        "  owner: view installed {installed}; read {got} samples of {} ({wrong} wrong){}; C \
         refused {refused} views for their uid; sessions ended by a view {ended}; C's view epoch \
         {epoch}",
        ctx.spec.num_files,
        fenced
            .as_deref()
            .map(|e| format!(", then failed: {e}"))
            .unwrap_or_default()
    );
    let refused_both = line("relaunch").starts_with("relaunch refused Permission")
        && line("relay").starts_with("relay refused Permission");
    r.check(
        Goal::Views,
        installed && refused_both && out.status.success(),
        format!(
            "another uid's relaunch epoch and relay view: {:?}, {:?}",
            line("relaunch"),
            line("relay")
        ),
    );
    r.check(
        Goal::Views,
        fenced.is_none() && ended == 0.0 && got == ctx.spec.num_files && epoch == 1.0,
        format!(
            "the owner's session was not fenced: {got} of {} samples read, {ended} sessions ended \
             by a view, view epoch {epoch}",
            ctx.spec.num_files
        ),
    );
    r.check(
        Goal::Clear,
        wrong == 0,
        format!("the owner's session read {wrong} wrong samples"),
    );
    let mut j = Json::default();
    j.str("join", &line("join"))
        .str("relaunch", &line("relaunch"))
        .str("relay", &line("relay"))
        .str("held", &line("held"))
        .num("refused_uid", refused, 0)
        .num("sessions_ended_by_view", ended, 0)
        .int("owner_samples", got)
        .int("owner_wrong", wrong)
        .str("owner_error", fenced.as_deref().unwrap_or(""));
    r.section("views", &j);
    Ok(())
}

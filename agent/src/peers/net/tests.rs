use super::*;
use granary_peer::conn::{Conn, Event as ConnEvent, Transmit};

/// A blocking connection to `to` from `ip` (port chosen by the kernel).
fn connect_from(ip: [u8; 4], to: SocketAddr) -> std::net::TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let s = rt
        .block_on(async {
            let s = tokio::net::TcpSocket::new_v4()?;
            s.bind(SocketAddr::from((ip, 0)))?;
            s.connect(to).await
        })
        .unwrap();
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// Whether the other side closed `s` within `wait`.
fn closed_within(s: &mut std::net::TcpStream, wait: Duration) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(wait)).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn a_full_listener_closes_its_oldest_handshake_to_take_a_member() {
    use granary_peer::view::Member;
    use std::io::{Read, Write};
    let secret = b"a-full-listener-test-secret".to_vec();
    let view = Arc::new(
        View::new(
            "j",
            0,
            [
                Member::new("a", "127.0.0.1:1", 1 << 30),
                Member::new("b", "127.0.0.1:2", 1 << 30),
            ],
        )
        .unwrap(),
    );
    let conn = ConnConfig::new("j", "a", view.digest().0, 1, secret.clone());
    let rejected: Family<Labels, Counter> = Family::default();
    let net = Net::start(
        NetConfig {
            view: Arc::clone(&view),
            me: 0,
            conn,
            connect_timeout: Duration::from_secs(2),
            redial_after: Duration::from_secs(1),
            settling: Duration::ZERO,
            source: None,
            limits: Limits {
                max_connections: 4,
                max_per_address: 2,
                ..Limits::default()
            },
            rejected: rejected.clone(),
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let to = net.local_addr();
    // Four silent strangers from two addresses hold every place.
    let mut strangers: Vec<std::net::TcpStream> = Vec::new();
    for k in 0..4u8 {
        strangers.push(connect_from([127, 0, 0, 21 + k / 2], to));
        // In order: the first is the oldest.
        std::thread::sleep(Duration::from_millis(50));
    }
    // A member dials from elsewhere and authenticates.
    let mut m = connect_from([127, 0, 0, 23], to);
    let mut cfg = ConnConfig::new("j", "b", view.digest().0, 2, secret);
    cfg.expected_peer = Some("a".into());
    let mut c = Conn::dial(cfg, [7u8; 32], 0).unwrap();
    while let Some(Transmit::Bytes(b)) = c.poll_transmit() {
        m.write_all(&b).unwrap();
    }
    m.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    let mut up = false;
    let mut buf = vec![0u8; 4096];
    while !up && Instant::now() < end {
        if let Ok(n) = m.read(&mut buf) {
            assert!(n > 0, "the member's connection was closed");
            c.handle_input(&buf[..n], 1);
        }
        while let Some(e) = c.poll_event() {
            assert!(!matches!(e, ConnEvent::Closed(_)), "{e:?}");
            up |= matches!(e, ConnEvent::Established { .. });
        }
    }
    assert!(
        up,
        "the member did not get in while strangers held every place"
    );
    // The oldest stranger made room; the others are still held.
    assert!(closed_within(&mut strangers[0], Duration::from_secs(2)));
    for s in &mut strangers[1..] {
        assert!(!closed_within(s, Duration::from_millis(100)));
    }
    assert_eq!(
        rejected
            .get_or_create(&label("reason", "connections"))
            .get(),
        1
    );
    // A stranger from an address at its own bound is refused outright,
    // and makes no room.
    let mut more = connect_from([127, 0, 0, 22], to);
    assert!(closed_within(&mut more, Duration::from_secs(2)));
    for s in &mut strangers[1..] {
        assert!(!closed_within(s, Duration::from_millis(100)));
    }
}

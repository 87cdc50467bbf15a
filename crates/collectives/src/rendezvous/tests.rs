//! The store's exchange against strangers, impostors, duplicates,
//! tricklers and ranks that die half way, on loopback only (ports from the
//! OS). No device is needed: the id is made-up bytes.

use super::auth::{LaunchSecret, nonce};
use super::store::{CLAIM, CLIENT_HELLO, MAGIC, SERVER_HELLO};
use super::{Rendezvous, Store};
use crate::error::Error;
use crate::types::UniqueId;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn id() -> UniqueId {
    UniqueId::from_bytes(&std::array::from_fn::<u8, 128, _>(|i| i as u8 ^ 0xa5)).unwrap()
}

fn launch(rank: usize, world: usize, port: u16, token: &str, timeout_s: f64) -> Rendezvous {
    let vars = |name: &str| match name {
        "RANK" => Some(rank.to_string()),
        "WORLD_SIZE" => Some(world.to_string()),
        "MASTER_ADDR" => Some("127.0.0.1".into()),
        "MASTER_PORT" => Some(port.to_string()),
        "CUDA_STREAMS_LAUNCH_TIMEOUT_S" => Some(timeout_s.to_string()),
        "CUDA_STREAMS_LAUNCH_TOKEN" => Some(token.into()),
        _ => None,
    };
    Rendezvous::from_vars(vars).unwrap()
}

fn bound_store() -> (Store, u16) {
    let store = Store::bind("127.0.0.1:0").unwrap();
    let port = store.port();
    (store, port)
}

/// Everything a connection reads until the other side closes it.
fn read_all(mut socket: TcpStream) -> Vec<u8> {
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut got = Vec::new();
    let _ = socket.read_to_end(&mut got);
    got
}

#[test]
fn strays_and_port_scans_take_no_rank_and_read_nothing() {
    let (store, port) = bound_store();
    let addr = format!("127.0.0.1:{port}");
    // Queued before the real rank: the old store counted each as a rank.
    let scan = TcpStream::connect(&addr).unwrap();
    drop(scan);
    let mut http = TcpStream::connect(&addr).unwrap();
    http.write_all(b"GET /health HTTP/1.0\r\n\r\n").unwrap();
    let silent = TcpStream::connect(&addr).unwrap();
    std::thread::scope(|s| {
        let http = s.spawn(move || read_all(http));
        let silent = s.spawn(move || read_all(silent));
        let rank1 = s.spawn(|| launch(1, 2, port, "job", 20.0).fetch_unique_id());
        store
            .publish(&launch(0, 2, port, "job", 20.0), &id())
            .unwrap();
        assert_eq!(rank1.join().unwrap().unwrap(), id());
        assert_eq!(http.join().unwrap(), b"", "a health check read something");
        assert_eq!(
            silent.join().unwrap(),
            b"",
            "a silent connection read something"
        );
    });
}

#[test]
fn a_wrong_token_gets_a_clear_error_and_the_job_goes_on() {
    let (store, port) = bound_store();
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| store.publish(&launch(0, 2, port, "job", 20.0), &id()));
        let err = launch(1, 2, port, "another job", 20.0)
            .fetch_unique_id()
            .unwrap_err();
        assert!(matches!(err, Error::StoreAuth { rank: 1, .. }), "{err}");
        assert!(
            err.to_string().contains("CUDA_STREAMS_LAUNCH_TOKEN"),
            "{err}"
        );
        assert!(!rank0.is_finished(), "rank 0 counted the stranger");
        assert_eq!(
            launch(1, 2, port, "job", 20.0).fetch_unique_id().unwrap(),
            id()
        );
        rank0.join().unwrap().unwrap();
    });
}

#[test]
fn a_stranger_that_speaks_the_protocol_without_the_secret_reads_only_a_nonce_and_a_proof() {
    let (store, port) = bound_store();
    let mut stranger = TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    stranger
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| store.publish(&launch(0, 2, port, "job", 20.0), &id()));
        let stranger = s.spawn(move || {
            stranger
                .write_all(&[MAGIC.as_slice(), &nonce().unwrap()].concat())
                .unwrap();
            let mut hello = [0u8; SERVER_HELLO];
            stranger.read_exact(&mut hello).unwrap();
            // A claim of rank 1 with a made-up proof.
            let mut claim = [0u8; CLAIM];
            claim[0] = 1;
            claim[8] = 2;
            stranger.write_all(&claim).unwrap();
            let rest = read_all(stranger);
            [hello.as_slice(), &rest].concat()
        });
        let got = stranger.join().unwrap();
        assert_eq!(
            got.len(),
            SERVER_HELLO,
            "the stranger read more than the server's hello"
        );
        let bytes = id().to_bytes();
        assert!(!got.windows(16).any(|w| bytes.windows(16).any(|v| v == w)));
        let id = id();
        assert!(!rank0.is_finished(), "rank 0 counted the stranger");
        assert_eq!(
            launch(1, 2, port, "job", 20.0).fetch_unique_id().unwrap(),
            id
        );
        rank0.join().unwrap().unwrap();
    });
}

#[test]
fn a_rank_claimed_twice_is_refused_to_the_second_claimant() {
    let (store, port) = bound_store();
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| store.publish(&launch(0, 3, port, "job", 20.0), &id()));
        assert_eq!(
            launch(1, 3, port, "job", 20.0).fetch_unique_id().unwrap(),
            id()
        );
        let err = launch(1, 3, port, "job", 20.0)
            .fetch_unique_id()
            .unwrap_err();
        assert!(matches!(err, Error::RankClaimed { rank: 1, .. }), "{err}");
        // Rank 0 counted neither the duplicate nor itself twice: it still
        // waits for rank 2.
        assert!(!rank0.is_finished());
        assert_eq!(
            launch(2, 3, port, "job", 20.0).fetch_unique_id().unwrap(),
            id()
        );
        rank0.join().unwrap().unwrap();
    });
}

#[test]
fn a_world_size_that_differs_from_rank_0s_is_named() {
    let (store, port) = bound_store();
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| store.publish(&launch(0, 2, port, "job", 20.0), &id()));
        let err = launch(2, 4, port, "job", 20.0)
            .fetch_unique_id()
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::WorldSizeMismatch {
                    rank: 2,
                    ours: 4,
                    rank0: 2
                }
            ),
            "{err}"
        );
        assert_eq!(
            launch(1, 2, port, "job", 20.0).fetch_unique_id().unwrap(),
            id()
        );
        rank0.join().unwrap().unwrap();
    });
}

/// Writes `bytes` one at a time, `every` apart, until the peer closes.
fn trickle(mut socket: TcpStream, bytes: &[u8], every: Duration) {
    for byte in bytes.iter().cycle() {
        // Pacing the stranger is the behaviour under test, not a wait.
        std::thread::sleep(every);
        if socket.write_all(&[*byte]).is_err() {
            return;
        }
    }
}

#[test]
fn a_trickling_client_neither_delays_real_ranks_nor_extends_rank_0s_deadline() {
    let (store, port) = bound_store();
    let addr = format!("127.0.0.1:{port}");
    let hello = [MAGIC.as_slice(), &[0u8; CLIENT_HELLO - 16]].concat();
    let trickler = TcpStream::connect(&addr).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| trickle(trickler, &hello, Duration::from_millis(100)));
        let start = Instant::now();
        let rank1 = s.spawn(|| launch(1, 2, port, "job", 20.0).fetch_unique_id());
        store
            .publish(&launch(0, 2, port, "job", 20.0), &id())
            .unwrap();
        assert_eq!(rank1.join().unwrap().unwrap(), id());
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    });
    // Alone, it keeps rank 0 no later than its deadline.
    let (store, port) = bound_store();
    let trickler = TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| trickle(trickler, &hello, Duration::from_millis(100)));
        let start = Instant::now();
        let err = store
            .publish(&launch(0, 2, port, "job", 1.5), &id())
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::StoreTimeout {
                    rank: 0,
                    missing: 1,
                    ..
                }
            ),
            "{err}"
        );
        let waited = start.elapsed();
        assert!(waited < Duration::from_millis(2500), "{waited:?}");
    });
}

#[test]
fn a_trickling_impostor_does_not_extend_a_ranks_deadline() {
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = fake.local_addr().unwrap().port();
    std::thread::scope(|s| {
        s.spawn(move || {
            let (socket, _) = fake.accept().unwrap();
            trickle(socket, MAGIC, Duration::from_millis(100));
        });
        let start = Instant::now();
        let err = launch(1, 2, port, "job", 1.5)
            .fetch_unique_id()
            .unwrap_err();
        assert!(matches!(err, Error::StoreTimeout { rank: 1, .. }), "{err}");
        let waited = start.elapsed();
        assert!(waited < Duration::from_millis(2500), "{waited:?}");
    });
}

#[test]
fn an_impostor_holding_the_port_is_refused_and_learns_nothing() {
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = fake.local_addr().unwrap().port();
    // The real rank 0 cannot take the port: a clear error at once.
    let err = Store::bind(&format!("127.0.0.1:{port}")).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Store {
                rank: 0,
                what: "listen",
                ..
            }
        ),
        "{err}"
    );
    std::thread::scope(|s| {
        let fake = s.spawn(move || {
            let (mut socket, _) = fake.accept().unwrap();
            let mut hello = [0u8; CLIENT_HELLO];
            socket.read_exact(&mut hello).unwrap();
            // It answers as rank 0 would, but cannot prove the secret.
            let reply = [MAGIC.as_slice(), &nonce().unwrap(), &nonce().unwrap()].concat();
            socket.write_all(&reply).unwrap();
            [hello.as_slice(), &read_all(socket)].concat()
        });
        let start = Instant::now();
        let err = launch(1, 2, port, "job", 20.0)
            .fetch_unique_id()
            .unwrap_err();
        assert!(matches!(err, Error::StoreAuth { rank: 1, .. }), "{err}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        // All it heard: the protocol's name and a fresh nonce.
        let heard = fake.join().unwrap();
        assert_eq!(heard.len(), CLIENT_HELLO, "{heard:?}");
        assert_eq!(&heard[..16], MAGIC);
    });
}

#[test]
fn a_silent_impostor_ends_in_a_timeout_by_the_deadline() {
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = fake.local_addr().unwrap().port();
    let start = Instant::now();
    // The OS completes the connection; nobody ever answers it.
    let err = launch(1, 2, port, "job", 1.0)
        .fetch_unique_id()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::StoreTimeout {
                rank: 1,
                missing: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    drop(fake);
}

#[test]
fn a_rank_that_dies_mid_exchange_is_not_counted() {
    let (store, port) = bound_store();
    let secret = LaunchSecret::from_token("job");
    let mut dying = TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    std::thread::scope(|s| {
        let rank0 = s.spawn(|| {
            let start = Instant::now();
            (
                store.publish(&launch(0, 2, port, "job", 1.5), &id()),
                start.elapsed(),
            )
        });
        // It proves nothing wrong, hears rank 0's proof, and dies.
        let cn = nonce().unwrap();
        dying.write_all(&[MAGIC.as_slice(), &cn].concat()).unwrap();
        let mut hello = [0u8; SERVER_HELLO];
        dying.read_exact(&mut hello).unwrap();
        assert!(secret.verify(b"server", &[&cn, &hello[16..48]], &hello[48..]));
        drop(dying);
        let (result, waited) = rank0.join().unwrap();
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                Error::StoreTimeout {
                    rank: 0,
                    missing: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert!(waited < Duration::from_millis(2500), "{waited:?}");
    });
}

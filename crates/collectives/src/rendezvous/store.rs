//! Rank 0's store: the one place the NCCL unique id crosses the network.
//!
//! A connection becomes a rank only after both sides proved they hold the
//! job's secret and the client claimed a rank that is free and in range;
//! nothing about the job is sent before. Every connection is served on a
//! thread of its own, so a silent or trickling one delays no other, and one
//! deadline bounds the whole exchange, not each read.
//!
//! The exchange, each message of fixed size:
//! 1. client: `MAGIC`, client nonce `cn`;
//! 2. server: `MAGIC`, server nonce `sn`, `mac("server", cn, sn)`;
//! 3. client: rank, world size, process id,
//!    `mac("claim", sn, cn, rank, world, pid)`;
//! 4. server: status, world size, process id, id (zeros unless granted),
//!    `mac("verdict", cn, sn, status, world, pid, id)`.

use super::auth::{LaunchSecret, MAC, NONCE, nonce};
use super::env::Rendezvous;
use crate::error::{Error, Result};
use crate::types::UniqueId;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

/// What opens every message of the protocol's first round.
pub(super) const MAGIC: &[u8; 16] = b"cuda-streams-id2";
pub(super) const CLIENT_HELLO: usize = 16 + NONCE;
pub(super) const SERVER_HELLO: usize = 16 + NONCE + MAC;
pub(super) const CLAIM: usize = 8 + 8 + 4 + MAC;
const VERDICT: usize = 1 + 8 + 4 + 128 + MAC;

/// A connection gets this long to finish its exchange (within the launch's
/// deadline): a real rank needs a few round trips, and a stranger's thread
/// should not outlive that by much.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// Connections served at once beyond the ranks still missing; more are
/// closed at once (and logged).
const SPARE_CONNECTIONS: usize = 64;

/// Rank 0's answer to a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Status {
    Granted = 0,
    Taken = 1,
    WorldMismatch = 2,
    OutOfRange = 3,
}

impl Status {
    fn from_byte(byte: u8) -> Option<Self> {
        [
            Self::Granted,
            Self::Taken,
            Self::WorldMismatch,
            Self::OutOfRange,
        ]
        .into_iter()
        .find(|s| *s as u8 == byte)
    }
}

/// Rank 0's listening socket, bound before the other ranks are told where
/// it is: bind port 0 and hand [`Store::port`] on, so no other program can
/// take the port in between.
///
/// ```
/// use cuda_streams_collectives::{Rendezvous, Store, UniqueId};
/// let store = Store::bind("127.0.0.1:0").unwrap();
/// let port = store.port();
/// let vars = move |rank: usize| {
///     move |name: &str| match name {
///         "RANK" => Some(rank.to_string()),
///         "WORLD_SIZE" => Some("2".into()),
///         "MASTER_PORT" => Some(port.to_string()),
///         "CUDA_STREAMS_LAUNCH_TIMEOUT_S" => Some("30".into()),
///         _ => None,
///     }
/// };
/// let id = UniqueId::new().unwrap();
/// let fetched = std::thread::scope(|s| {
///     let rank1 = s.spawn(|| Rendezvous::from_vars(vars(1)).unwrap().fetch_unique_id());
///     store.publish(&Rendezvous::from_vars(vars(0)).unwrap(), &id).unwrap();
///     rank1.join().unwrap().unwrap()
/// });
/// assert_eq!(fetched, id);
/// ```
#[derive(Debug)]
pub struct Store {
    listener: TcpListener,
    addr: String,
}

/// A rank rank 0 has served.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Served {
    pub(crate) rank: usize,
    pub(crate) pid: u32,
}

/// What rank 0 told a rank.
pub(crate) struct Fetched {
    pub(crate) id: UniqueId,
    pub(crate) rank0_pid: u32,
}

impl Store {
    /// Listen at `addr` (`host:port`), on the first address it resolves to
    /// that can be bound: only that interface, so a loopback store is not
    /// reachable from other hosts. Port 0 takes a free port from the OS.
    pub fn bind(addr: &str) -> Result<Store> {
        let error = |what, source| Error::Store {
            rank: 0,
            addr: addr.to_string(),
            what,
            source,
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, "it resolves to no address");
        for target in addr.to_socket_addrs().map_err(|e| error("resolve", e))? {
            match TcpListener::bind(target) {
                Ok(listener) => {
                    listener
                        .set_nonblocking(true)
                        .map_err(|e| error("listen", e))?;
                    return Ok(Store {
                        listener,
                        addr: addr.to_string(),
                    });
                }
                Err(err) => last = err,
            }
        }
        Err(error("listen", last))
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|source| Error::Store {
            rank: 0,
            addr: self.addr.clone(),
            what: "read the address of",
            source,
        })
    }

    /// The port it listens on (the OS's choice where it was bound to port 0).
    pub fn port(&self) -> u16 {
        self.local_addr().map_or(0, |addr| addr.port())
    }

    /// Hand `id` to every other rank of `launch` (rank 0's part), within
    /// `launch.timeout`: [`Error::StoreTimeout`] when not every rank came
    /// in time. Connections that do not prove they hold `launch.secret`, or
    /// claim a rank already served, are dropped and logged, never counted.
    pub fn publish(self, launch: &Rendezvous, id: &UniqueId) -> Result<()> {
        self.serve(launch, id, Instant::now() + launch.timeout)
            .map(drop)
    }

    /// [`Store::publish`] until `deadline`, saying which process each rank
    /// is in.
    pub(crate) fn serve(
        self,
        launch: &Rendezvous,
        id: &UniqueId,
        deadline: Instant,
    ) -> Result<Vec<Served>> {
        let needed = launch.world_size - 1;
        let claimed = Mutex::new(vec![false; launch.world_size]);
        let (tx, rx) = mpsc::channel::<(u64, Option<Served>)>();
        // The connections being served, by number: shut down when rank 0
        // is done, so their threads return at once.
        let mut open: HashMap<u64, TcpStream> = HashMap::new();
        let mut number = 0u64;
        let mut served = Vec::with_capacity(needed);
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        let job = Job {
            secret: &launch.secret,
            world_size: launch.world_size,
            id: id.to_bytes(),
            pid: std::process::id(),
            claimed: &claimed,
        };
        let outcome = std::thread::scope(|s| {
            let outcome = loop {
                while let Ok((number, result)) = rx.try_recv() {
                    open.remove(&number);
                    served.extend(result);
                }
                if served.len() == needed {
                    break Ok(());
                }
                match self.listener.accept() {
                    Ok((socket, peer)) => {
                        pause = Duration::from_millis(1);
                        if open.len() >= needed - served.len() + SPARE_CONNECTIONS {
                            tracing::warn!(%peer, open = open.len(), "launch store: too many connections at once; closing this one");
                            continue;
                        }
                        match socket.try_clone() {
                            Ok(clone) => open.insert(number, clone),
                            Err(err) => {
                                tracing::warn!(%peer, "launch store: closing a connection: {err}");
                                continue;
                            }
                        };
                        let this = number;
                        number += 1;
                        let tx = tx.clone();
                        let job = &job;
                        s.spawn(move || {
                            let until = deadline.min(Instant::now() + HANDSHAKE_LIMIT);
                            let result = match job.answer(&socket, until) {
                                Ok(served) => {
                                    tracing::debug!(%peer, rank = served.rank, "launch store: rank served");
                                    Some(served)
                                }
                                Err(why) => {
                                    tracing::warn!(%peer, "launch store: dropped a connection: {why}");
                                    None
                                }
                            };
                            // Closed now, whatever other handle is left: a
                            // stranger learns at once that it is done.
                            let _ = socket.shutdown(Shutdown::Both);
                            // The loop may have ended: nobody listens then.
                            let _ = tx.send((this, result));
                        });
                    }
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                        let now = Instant::now();
                        if now >= deadline {
                            break Err(Error::StoreTimeout {
                                rank: 0,
                                addr: self.addr.clone(),
                                waited: start.elapsed(),
                                missing: needed - served.len(),
                            });
                        }
                        // std has no accept with a timeout: poll, briefly.
                        std::thread::sleep(pause.min(deadline - now));
                        pause = (pause * 2).min(Duration::from_millis(20));
                    }
                    Err(source) => {
                        break Err(Error::Store {
                            rank: 0,
                            addr: self.addr.clone(),
                            what: "accept",
                            source,
                        });
                    }
                }
            };
            // End the connections still being served (strangers, late
            // duplicates), so their threads return now.
            for socket in open.values() {
                let _ = socket.shutdown(Shutdown::Both);
            }
            outcome
        });
        outcome.map(|()| served)
    }
}

/// What a connection's thread needs to answer it.
struct Job<'a> {
    secret: &'a LaunchSecret,
    world_size: usize,
    id: [u8; 128],
    pid: u32,
    claimed: &'a Mutex<Vec<bool>>,
}

impl Job<'_> {
    /// Serve one connection until `until`: the rank it became, or why it
    /// was dropped.
    fn answer(&self, socket: &TcpStream, until: Instant) -> std::result::Result<Served, String> {
        socket
            .set_nonblocking(false)
            .map_err(|e| format!("cannot serve it: {e}"))?;
        let mut hello = [0u8; CLIENT_HELLO];
        read_until(socket, &mut hello, until).map_err(|e| format!("no hello: {e}"))?;
        if &hello[..16] != MAGIC {
            return Err("it does not speak the launch protocol".into());
        }
        let cn = &hello[16..];
        let sn = nonce().map_err(|e| e.to_string())?;
        let proof = self.secret.mac(b"server", &[cn, &sn]);
        write_until(socket, &[MAGIC.as_slice(), &sn, &proof].concat(), until)
            .map_err(|e| format!("cannot answer its hello: {e}"))?;
        let mut claim = [0u8; CLAIM];
        read_until(socket, &mut claim, until).map_err(|e| format!("no claim: {e}"))?;
        let (body, tag) = claim.split_at(CLAIM - MAC);
        if !self.secret.verify(b"claim", &[&sn, cn, body], tag) {
            return Err("it did not prove it holds the launch secret".into());
        }
        let rank = u64::from_le_bytes(body[..8].try_into().unwrap_or_default());
        let world = u64::from_le_bytes(body[8..16].try_into().unwrap_or_default());
        let pid = u32::from_le_bytes(body[16..20].try_into().unwrap_or_default());
        let status = {
            let mut claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
            if world != self.world_size as u64 {
                Status::WorldMismatch
            } else if rank >= world {
                Status::OutOfRange
            } else if rank == 0 || claimed[rank as usize] {
                Status::Taken
            } else {
                claimed[rank as usize] = true;
                Status::Granted
            }
        };
        let granted = status == Status::Granted;
        let id = if granted { self.id } else { [0u8; 128] };
        let body = [
            [status as u8].as_slice(),
            &(self.world_size as u64).to_le_bytes(),
            &self.pid.to_le_bytes(),
            &id,
        ]
        .concat();
        let tag = self.secret.mac(b"verdict", &[cn, &sn, &body]);
        let sent = write_until(socket, &[body.as_slice(), &tag].concat(), until);
        match (status, sent) {
            (Status::Granted, Ok(())) => Ok(Served {
                rank: rank as usize,
                pid,
            }),
            (Status::Granted, Err(err)) => {
                // It left before its answer: a restarted rank may claim it.
                self.claimed.lock().unwrap_or_else(|e| e.into_inner())[rank as usize] = false;
                Err(format!("rank {rank} left before its answer: {err}"))
            }
            (status, _) => Err(format!(
                "refused its claim of rank {rank} in a world of {world} ({status:?})"
            )),
        }
    }
}

/// Why one attempt at rank 0's store failed.
enum Attempt {
    /// Nothing proved who listens there (it closed before its proof): try
    /// again, rank 0 may come.
    Again(io::Error),
    /// The deadline passed.
    TimedOut,
    /// A clear answer: give up with it.
    Fail(Error),
}

impl Rendezvous {
    /// Fetch NCCL's unique id from rank 0's store (a rank other than 0),
    /// retrying until rank 0 listens or `timeout` has passed.
    ///
    /// Nothing is sent before rank 0 proves it holds [`Rendezvous::secret`]: a
    /// program that holds the port without it gets a nonce, and this rank
    /// [`Error::StoreAuth`].
    pub fn fetch_unique_id(&self) -> Result<UniqueId> {
        self.fetch(Instant::now() + self.timeout).map(|f| f.id)
    }

    /// [`Rendezvous::fetch_unique_id`] until `deadline`, with rank 0's process.
    pub(crate) fn fetch(&self, deadline: Instant) -> Result<Fetched> {
        let addr = self.store_addr();
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        let mut last: Option<String> = None;
        loop {
            let now = Instant::now();
            if now >= deadline {
                if let Some(last) = &last {
                    tracing::debug!(
                        rank = self.rank,
                        "last try at the launch store {addr}: {last}"
                    );
                }
                return Err(Error::StoreTimeout {
                    rank: self.rank,
                    addr,
                    waited: start.elapsed(),
                    missing: 1,
                });
            }
            let targets = addr.to_socket_addrs().map_err(|source| Error::Store {
                rank: self.rank,
                addr: addr.clone(),
                what: "resolve",
                source,
            })?;
            for target in targets {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let socket = match TcpStream::connect_timeout(&target, left) {
                    Ok(socket) => socket,
                    Err(err) => {
                        last = Some(format!("connect to {target}: {err}"));
                        continue;
                    }
                };
                match self.claim(socket, deadline, &addr) {
                    Ok(fetched) => return Ok(fetched),
                    Err(Attempt::Fail(err)) => return Err(err),
                    Err(Attempt::TimedOut) => {
                        return Err(Error::StoreTimeout {
                            rank: self.rank,
                            addr,
                            waited: start.elapsed(),
                            missing: 1,
                        });
                    }
                    Err(Attempt::Again(err)) => last = Some(format!("{target}: {err}")),
                }
            }
            // Rank 0 is not listening yet: try again shortly.
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// One exchange with whatever listens at the store.
    fn claim(
        &self,
        socket: TcpStream,
        deadline: Instant,
        addr: &str,
    ) -> std::result::Result<Fetched, Attempt> {
        let io_failed = |err: io::Error, again: bool| {
            if err.kind() == io::ErrorKind::TimedOut {
                Attempt::TimedOut
            } else if again {
                Attempt::Again(err)
            } else {
                Attempt::Fail(Error::Store {
                    rank: self.rank,
                    addr: addr.to_string(),
                    what: "hear rank 0's answer",
                    source: err,
                })
            }
        };
        let auth = |why: &str| {
            Attempt::Fail(Error::StoreAuth {
                rank: self.rank,
                addr: addr.to_string(),
                why: why.to_string(),
                secret: self.secret.source().to_string(),
            })
        };
        let cn = nonce().map_err(|e| io_failed(e, false))?;
        write_until(&socket, &[MAGIC.as_slice(), &cn].concat(), deadline)
            .map_err(|e| io_failed(e, true))?;
        let mut hello = [0u8; SERVER_HELLO];
        read_until(&socket, &mut hello, deadline).map_err(|e| io_failed(e, true))?;
        if &hello[..16] != MAGIC {
            return Err(auth("does not speak this launch protocol"));
        }
        let sn = &hello[16..16 + NONCE];
        if !self
            .secret
            .verify(b"server", &[&cn, sn], &hello[16 + NONCE..])
        {
            return Err(auth(
                "answered with a proof of another secret than this rank's",
            ));
        }
        // Rank 0 proved itself: from here on a failure is final.
        let body = [
            (self.rank as u64).to_le_bytes().as_slice(),
            &(self.world_size as u64).to_le_bytes(),
            &std::process::id().to_le_bytes(),
        ]
        .concat();
        let tag = self.secret.mac(b"claim", &[sn, &cn, &body]);
        write_until(&socket, &[body.as_slice(), &tag].concat(), deadline)
            .map_err(|e| io_failed(e, false))?;
        let mut verdict = [0u8; VERDICT];
        read_until(&socket, &mut verdict, deadline).map_err(|e| io_failed(e, false))?;
        let (body, tag) = verdict.split_at(VERDICT - MAC);
        if !self.secret.verify(b"verdict", &[&cn, sn, body], tag) {
            return Err(auth(
                "sent an answer that is not proved with this rank's secret",
            ));
        }
        let world = u64::from_le_bytes(body[1..9].try_into().unwrap_or_default()) as usize;
        let rank0_pid = u32::from_le_bytes(body[9..13].try_into().unwrap_or_default());
        let fail = |err| Err(Attempt::Fail(err));
        match Status::from_byte(body[0]) {
            Some(Status::Granted) => UniqueId::from_bytes(&body[13..])
                .map(|id| Fetched { id, rank0_pid })
                .map_err(Attempt::Fail),
            Some(Status::Taken) => fail(Error::RankClaimed {
                rank: self.rank,
                addr: addr.to_string(),
            }),
            Some(Status::WorldMismatch) => fail(Error::WorldSizeMismatch {
                rank: self.rank,
                ours: self.world_size,
                rank0: world,
            }),
            Some(Status::OutOfRange) | None => fail(Error::InvalidRank {
                rank: self.rank,
                nranks: world,
            }),
        }
    }
}

/// `read_exact`, but all of it by `until`: a peer that trickles bytes does
/// not extend the wait (a per-read timeout alone would let it).
fn read_until(mut socket: &TcpStream, buf: &mut [u8], until: Instant) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        socket.set_read_timeout(Some(left(until)?))?;
        match socket.read(&mut buf[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::ErrorKind::TimedOut.into());
            }
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// `write_all`, but all of it by `until`.
fn write_until(mut socket: &TcpStream, buf: &[u8], until: Instant) -> io::Result<()> {
    let mut written = 0;
    while written < buf.len() {
        socket.set_write_timeout(Some(left(until)?))?;
        match socket.write(&buf[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::ErrorKind::TimedOut.into());
            }
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Time left until `until`, or `TimedOut` (a zero timeout means "none" to
/// std).
fn left(until: Instant) -> io::Result<Duration> {
    let left = until.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::ErrorKind::TimedOut.into())
    } else {
        Ok(left)
    }
}

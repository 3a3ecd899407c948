//! The h2 transport's connections: the accept loop, each connection's HTTP/2 session, and the
//! cap on connections open at once.
//!
//! What a reader would not guess: at `max_connections` a new connection closes the one idle the
//! longest (and is itself closed unserved when every one has a call open), and a connection
//! closed for idleness has [`GOODBYE`] to finish after its GOAWAY.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use std::net::TcpListener as StdListener;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::h2_call::call;
use super::{
    CONNECTION_WINDOW, GOODBYE, Inbox, MAX_FRAME, MAX_HEADERS, MAX_STREAMS, STREAM_WINDOW, Serving,
};
use crate::budget::ByteBudget;

/// A connection as the accept loop sees it: its calls open now, when it last started or ended
/// one, and the signal that closes it at once.
pub(super) struct Peer {
    /// Its place in the order of arrival (of two idle as long, the older is closed first).
    seq: u64,
    calls: AtomicUsize,
    /// Milliseconds from the server's epoch.
    last: AtomicU64,
    close: Notify,
}

impl Peer {
    fn new(serving: &Serving, seq: u64) -> Self {
        let peer = Peer {
            seq,
            calls: AtomicUsize::new(0),
            last: AtomicU64::new(0),
            close: Notify::new(),
        };
        peer.touch(serving);
        peer
    }

    fn touch(&self, serving: &Serving) {
        let now = serving.epoch.elapsed().as_millis() as u64;
        self.last.store(now, Ordering::Relaxed);
    }

    fn idle_since(&self, serving: &Serving) -> Instant {
        serving.epoch + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }
}

/// A call open on its connection, from its headers until its answer is sent.
pub(super) struct Open<'a> {
    peer: &'a Peer,
    serving: &'a Serving,
}

impl<'a> Open<'a> {
    pub(super) fn new(peer: &'a Peer, serving: &'a Serving) -> Self {
        peer.calls.fetch_add(1, Ordering::Relaxed);
        peer.touch(serving);
        Open { peer, serving }
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.peer.touch(self.serving);
        self.peer.calls.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Close the connection idle the longest to make room for a new one; false when every one has
/// a call open.
fn make_room(peers: &mut HashMap<tokio::task::Id, Arc<Peer>>) -> bool {
    let idlest = peers
        .iter()
        .filter(|(_, peer)| peer.calls.load(Ordering::Relaxed) == 0)
        .min_by_key(|(_, peer)| (peer.last.load(Ordering::Relaxed), peer.seq))
        .map(|(id, _)| *id);
    match idlest.and_then(|id| peers.remove(&id)) {
        Some(peer) => {
            peer.close.notify_one();
            true
        }
        None => false,
    }
}

/// `listener` as the runtime's listener, or `None` when it cannot be one.
pub(crate) fn listening(listener: StdListener) -> Option<TcpListener> {
    listener
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(listener))
        .ok()
}

/// The next connection `listener` accepts; after a failure (out of descriptors, say) it waits a
/// little rather than spin.
pub(crate) async fn next_socket(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((socket, _)) => return socket,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

pub(super) async fn serve(
    listeners: Vec<StdListener>,
    inbox: Arc<Inbox>,
    serving: Arc<Serving>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let (accepted, mut sockets) = mpsc::channel::<TcpStream>(64);
    let mut accepting = JoinSet::new();
    for listener in listeners {
        let accepted = accepted.clone();
        accepting.spawn(async move {
            let Some(listener) = listening(listener) else {
                return;
            };
            loop {
                if accepted.send(next_socket(&listener).await).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(accepted);
    let mut connections = JoinSet::new();
    let mut peers: HashMap<tokio::task::Id, Arc<Peer>> = HashMap::new();
    let mut arrivals = 0u64;
    let mut listening = true;
    let grace = loop {
        tokio::select! {
            socket = sockets.recv(), if listening => match socket {
                Some(socket) => {
                    if peers.len() >= serving.limits.max_connections && !make_room(&mut peers) {
                        // Every connection has a call open: this one is closed unserved.
                        drop(socket);
                        continue;
                    }
                    arrivals += 1;
                    let peer = Arc::new(Peer::new(&serving, arrivals));
                    let task = connections.spawn(connection(
                        socket,
                        Arc::clone(&peer),
                        Arc::clone(&inbox),
                        Arc::clone(&serving),
                        stop.clone(),
                    ));
                    peers.insert(task.id(), peer);
                }
                None => listening = false,
            },
            changed = stop.changed() => {
                match (changed, *stop.borrow()) {
                    (Ok(()), Some(grace)) => break grace,
                    (Ok(()), None) => continue,
                    (Err(_), _) => break Duration::ZERO,
                }
            },
            Some(ended) = connections.join_next_with_id(), if !connections.is_empty() => {
                let id = match ended {
                    Ok((id, ())) => id,
                    Err(error) => error.id(),
                };
                peers.remove(&id);
            }
        }
    };
    // No new connections (the listeners close); the open ones send GOAWAY and finish their calls.
    accepting.abort_all();
    drop(sockets);
    let _ = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

async fn connection(
    socket: TcpStream,
    peer: Arc<Peer>,
    inbox: Arc<Inbox>,
    serving: Arc<Serving>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let _ = socket.set_nodelay(true);
    let limits = serving.limits;
    let share = u32::try_from(limits.max_connection_bytes).unwrap_or(u32::MAX);
    let handshake = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW.min(share).max(1))
        .initial_connection_window_size(CONNECTION_WINDOW.min(share).max(1))
        .max_frame_size(MAX_FRAME)
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADERS)
        .handshake::<_, Bytes>(socket);
    let mut connection = tokio::select! {
        shaken = tokio::time::timeout(limits.read_timeout, handshake) => match shaken {
            Ok(Ok(connection)) => connection,
            _ => return,
        },
        () = peer.close.notified() => return,
    };
    let budget = ByteBudget::within(&serving.budget, limits.max_connection_bytes);
    let idle = tokio::time::sleep(limits.idle_timeout);
    tokio::pin!(idle);
    let mut stopping = stop.borrow().is_some();
    if stopping {
        connection.graceful_shutdown();
    }
    // When the connection was closed for idleness: when it must be gone.
    let mut goodbye: Option<Instant> = None;
    loop {
        let next = if let Some(by) = goodbye {
            tokio::select! {
                next = connection.accept() => next,
                () = tokio::time::sleep_until(by) => {
                    if peer.calls.load(Ordering::Relaxed) == 0 {
                        return;
                    }
                    goodbye = Some(Instant::now() + GOODBYE);
                    continue;
                }
            }
        } else if stopping {
            connection.accept().await
        } else {
            tokio::select! {
                next = connection.accept() => next,
                _ = stop.changed() => {
                    stopping = true;
                    connection.graceful_shutdown();
                    continue;
                }
                () = peer.close.notified() => return,
                () = &mut idle => {
                    let since = peer.idle_since(&serving);
                    if peer.calls.load(Ordering::Relaxed) == 0
                        && since + limits.idle_timeout <= Instant::now()
                    {
                        connection.graceful_shutdown();
                        goodbye = Some(Instant::now() + GOODBYE);
                    } else {
                        let from = since.max(Instant::now());
                        idle.as_mut().reset(from + limits.idle_timeout);
                    }
                    continue;
                }
            }
        };
        match next {
            Some(Ok((request, respond))) => {
                tokio::spawn(call(
                    request,
                    respond,
                    Arc::clone(&peer),
                    Arc::clone(&budget),
                    Arc::clone(&inbox),
                    Arc::clone(&serving),
                ));
            }
            Some(Err(_)) | None => return,
        }
    }
}

//! `fencelock top`: the dashboard's live data in a terminal (over SSH too,
//! readable in 80×24): the locks under a prefix in contention order with
//! their holders, tokens, countdowns and queues, the group's health (with
//! `--admin`), and whether the server is reachable.
//!
//! It reads through the Rust client as `fencelock locks` and `fencelock
//! watch` do: `list` for the table, a `watch` of the same prefix only as the
//! signal to list again (at most every [`SOON`] after an event), and a list
//! every [`EVERY`] besides, since keep-alives are not events. Between lists
//! the countdowns move by the ticks of [`TICK`] (no clock is read). This
//! module is the loop; [`state`] is what is shown and what keys do to it,
//! [`screen`] draws it (pure), [`term`] is the terminal, [`group`] the
//! admin port.

mod group;
mod screen;
mod state;
mod term;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use fencelock::{Client, LockInfo, WatchStream};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::{interval, Instant, MissedTickBehavior, Sleep};

use crate::{client_cmds::connect, exit, ServerArg};
use group::Admin;
use state::{Action, Group, View};

/// After a watch event, list again this much later (events close together
/// make one list).
const SOON: Duration = Duration::from_millis(100);
/// List (and ask the admin port) this often anyway.
const EVERY: Duration = Duration::from_secs(2);
/// The countdowns move, and the screen is drawn, this often.
const TICK: Duration = Duration::from_millis(250);
/// A list that takes longer counts as unreachable (the client keeps trying
/// its servers until its own, longer, deadline).
const LIST_TIMEOUT: Duration = Duration::from_secs(3);
/// The most locks listed.
const LIMIT: u32 = 1000;

#[derive(Args, Debug)]
pub struct TopArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Only locks whose names start with this at first ("" = all); `/`
    /// changes it.
    #[arg(long, default_value = "")]
    prefix: String,
    /// A member's HTTP admin address (host:port; several, comma-separated,
    /// the leader's answer preferred) for the group line: members, leader,
    /// term and each member's lag, or that node's health where the token may
    /// not see the group. TLS and the token as for --server.
    #[arg(long, env = "FENCELOCK_ADMIN", value_delimiter = ',', value_name = "HOST:PORT")]
    admin: Vec<SocketAddr>,
}

/// What a list found.
enum Listed {
    Locks(Vec<LockInfo>),
    /// The server answered, and would not list: a refusal, a bad prefix.
    Problem(String),
    /// No server answered.
    Unreachable,
}

/// A request under way, or none.
type Pending<T> = Option<Pin<Box<dyn Future<Output = T>>>>;

pub async fn top(a: TopArgs) -> anyhow::Result<ExitCode> {
    if !term::is_terminal() {
        eprintln!(
            "fencelock: error: fencelock top needs a terminal; use `fencelock locks` or `fencelock watch` in scripts"
        );
        return Ok(ExitCode::from(exit::USAGE));
    }
    let client = connect(&a.server).await?;
    let admin = Admin::new(a.admin, &a.server);
    let group = if admin.is_some() { Group::Asking } else { Group::NoAdmin };
    let view = View::new(a.server.shown(), a.prefix, group);
    let signals = Signals::new()?;
    let _terminal = term::Terminal::enter()?;
    Live::new(client, admin, view).run(signals).await
}

/// The signals that end `top` (the terminal's keys do not send them in raw
/// mode: Ctrl-C is a key) and the one that says the terminal was resized.
struct Signals {
    resized: Signal,
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            resized: signal(SignalKind::window_change())?,
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }
}

/// The loop's state besides the view: the watch, the requests under way.
struct Live {
    client: Client,
    admin: Option<Admin>,
    view: View,
    screen: term::Screen,
    watch: Option<WatchStream>,
    list: Pending<Listed>,
    /// Another list is wanted once the one under way answers.
    again: bool,
    /// A list is due after a watch event.
    soon: Option<Pin<Box<Sleep>>>,
    group: Pending<Group>,
}

impl Live {
    fn new(client: Client, admin: Option<Admin>, view: View) -> Live {
        let mut live = Live {
            watch: None,
            list: None,
            again: false,
            soon: None,
            group: None,
            screen: term::Screen::default(),
            client,
            admin,
            view,
        };
        live.follow();
        live.ask_group();
        live
    }

    async fn run(mut self, mut sig: Signals) -> anyhow::Result<ExitCode> {
        let mut keys = term::read_keys();
        let mut every = interval(EVERY);
        every.set_missed_tick_behavior(MissedTickBehavior::Delay);
        every.tick().await; // the first tick is now: the first list is under way
        let mut ticks = interval(TICK);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
        // The tick before the table came: its age counts from there (up to
        // a tick too old, so a countdown is never behind the server's).
        let (mut last_tick, mut listed_at): (Instant, Instant) = {
            let t = ticks.tick().await;
            (t, t)
        };
        self.draw()?;
        loop {
            tokio::select! {
                bytes = keys.recv() => {
                    let Some(bytes) = bytes else { break }; // the terminal hung up
                    for key in term::decode_keys(&bytes) {
                        match self.view.on_key(key) {
                            Action::Quit => return Ok(ExitCode::from(exit::OK)),
                            Action::Refresh => self.list_again(),
                            Action::Apply => self.follow(),
                            Action::Redraw | Action::Nothing => {}
                        }
                    }
                }
                event = next_event(&mut self.watch) => match event {
                    Some(Ok(e)) => {
                        if e.kind == fencelock::WatchKind::WriteRefused {
                            self.view.refused(state::FenceRefusal {
                                lock: e.lock,
                                token: e.token,
                                highest_token: e.highest_token,
                                resource: e.resource,
                            });
                        }
                        if self.soon.is_none() {
                            self.soon = Some(Box::pin(tokio::time::sleep(SOON)));
                        }
                    }
                    // It ended (refused: the list says why); reopened at the next EVERY.
                    Some(Err(_)) | None => self.watch = None,
                },
                () = due(&mut self.soon) => {
                    self.soon = None;
                    self.list_again();
                }
                _ = every.tick() => {
                    self.list_again();
                    self.ask_group();
                    if self.watch.is_none() && self.view.problem.is_none() {
                        self.watch = Some(self.client.watch(self.view.prefix.clone()));
                    }
                }
                t = ticks.tick() => {
                    last_tick = t;
                    self.view.age = t.saturating_duration_since(listed_at);
                }
                listed = settle(&mut self.list) => {
                    self.list = None;
                    if self.listed(listed) {
                        listed_at = last_tick;
                    }
                    if std::mem::take(&mut self.again) {
                        self.list_again();
                    }
                }
                group = settle(&mut self.group) => {
                    self.group = None;
                    self.view.group = group;
                }
                _ = sig.resized.recv() => {}
                _ = sig.interrupt.recv() => break,
                _ = sig.terminate.recv() => break,
                _ = sig.hangup.recv() => break,
            }
            self.draw()?;
        }
        Ok(ExitCode::from(exit::OK))
    }

    /// Watch and list the view's prefix, dropping what was under way for
    /// the one before.
    fn follow(&mut self) {
        self.watch = Some(self.client.watch(self.view.prefix.clone()));
        self.soon = None;
        self.again = false;
        self.list = Some(Box::pin(list(self.client.clone(), self.view.prefix.clone())));
    }

    /// List now, or once the list under way answers.
    fn list_again(&mut self) {
        match self.list {
            Some(_) => self.again = true,
            None => self.list = Some(Box::pin(list(self.client.clone(), self.view.prefix.clone()))),
        }
    }

    /// Ask the admin port, unless a question is under way (or there is none).
    fn ask_group(&mut self) {
        if let (Some(admin), None) = (&self.admin, &self.group) {
            let admin = admin.clone();
            self.group = Some(Box::pin(async move { admin.fetch().await }));
        }
    }

    /// Show what a list found; whether it was a table (whose age then
    /// starts).
    fn listed(&mut self, listed: Listed) -> bool {
        match listed {
            Listed::Locks(locks) => {
                self.view.set_locks(locks);
                return true;
            }
            Listed::Problem(why) => self.view.set_problem(why),
            Listed::Unreachable => self.view.set_unreachable(),
        }
        false
    }

    fn draw(&mut self) -> std::io::Result<()> {
        let (width, height) = term::size();
        self.screen.draw(&screen::render(&self.view, width, height), width, height)
    }
}

/// The locks under `prefix`, or why not.
async fn list(client: Client, prefix: String) -> Listed {
    match tokio::time::timeout(LIST_TIMEOUT, client.list(&prefix, LIMIT)).await {
        Ok(Ok(locks)) => Listed::Locks(locks),
        Ok(Err(fencelock::Error::Unavailable(_) | fencelock::Error::Timeout | fencelock::Error::Connect { .. }))
        | Err(_) => Listed::Unreachable,
        Ok(Err(e)) => Listed::Problem(e.to_string()),
    }
}

/// The watch's next event; never, without a watch.
async fn next_event(watch: &mut Option<WatchStream>) -> Option<Result<fencelock::WatchEvent, fencelock::Error>> {
    match watch {
        Some(w) => w.next_event().await,
        None => std::future::pending().await,
    }
}

/// When the list due after an event is; never, without one.
async fn due(soon: &mut Option<Pin<Box<Sleep>>>) {
    match soon {
        Some(s) => s.await,
        None => std::future::pending().await,
    }
}

/// The answer of the request under way; never, without one.
async fn settle<T>(pending: &mut Pending<T>) -> T {
    match pending {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

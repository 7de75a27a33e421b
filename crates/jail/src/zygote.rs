//! The helper zygote: one freshly exec'd, single-threaded `airlock-jail --zygote` per long-lived
//! runtime, which forks a helper per sandbox instead of the runtime exec'ing one.
//!
//! A fork of this small process costs less than an exec of the helper (about 0.4 ms here, most
//! of it the dynamic start-up's `cpuid` traps on this nested host). The zygote holds nothing of
//! any sandbox: it receives a request's descriptors, forks, and closes them at once, and it never
//! runs helper code itself. Each helper is forked with `CLONE_PARENT`, so it is the runtime's
//! child, exactly as an exec'd one: the supervisor reaps it, its parent-death signal follows the
//! runtime, and `getppid()` is the supervisor's pid the spec names. The zygote's own parent is a
//! keeper thread that lives as long as the zygote, since a parent-death signal follows the thread
//! that made the child. Every sandbox process that runs sandbox code is exec'd later (the agent,
//! the workload), so sandboxes from one zygote share no address-space layout that they can see.
//!
//! It also keeps network namespaces made ahead by its pooler (`network_pool`), and gives one to
//! each helper that asks, at `NETNS_FD` and `SYSFS_FD`. The pool is refilled only when the
//! runtime says that the sandbox which took a namespace has started (or ended): measured, a
//! refill at the fork made the namespace while that sandbox started, on a CPU its helper and the
//! runtime's thread needed, and the zygote's answer came 0.5-0.6 ms after the request instead
//! of 0.2-0.3 ms.
//!
//! Wire: the runtime sends one message per helper, `[mask]` with the descriptors of the targets
//! whose bit is set (bit 0 `SPEC_FD`, 1 `REPORT_FD`, 2 `CONTROL_FD`, 3 `HOLD_FD`, 4
//! `TEMPLATE_FD`), in that order, and bit 7 set to ask for a pooled network namespace; the
//! zygote answers `P`, the helper's pid (4 bytes, little-endian) and 1 if it installed a pooled
//! namespace (else 0), or `E` and an errno. `[REFILL]` alone, with no descriptor and no
//! answer, asks the pooler for one namespace.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use crate::network_pool::{Network, Pool};
use crate::report::{CONTROL_FD, HOLD_FD, NETNS_FD, REPORT_FD, SPEC_FD, SYSFS_FD, TEMPLATE_FD};
use crate::scm;
use crate::sys::{self, Forked};

/// The argument that makes `airlock-jail` a zygote.
pub const ZYGOTE_ARG: &CStr = c"--zygote";

/// The descriptor targets a request may fill, in wire order.
const TARGETS: [RawFd; 5] = [SPEC_FD, REPORT_FD, CONTROL_FD, HOLD_FD, TEMPLATE_FD];

/// The request's bit that asks for a pooled network namespace.
const NETWORK_WANTED: u8 = 0x80;

/// The message that asks the pooler for one namespace, after a sandbox that took one started.
const REFILL: u8 = 0x40;

/// A running zygote, seen from the runtime.
#[derive(Debug)]
pub struct Zygote {
    /// Our end of the request socket (one request at a time); `None` once dropped.
    channel: Mutex<Option<OwnedFd>>,
    pid: libc::pid_t,
    keeper: Option<JoinHandle<()>>,
    /// Helpers forked so far.
    forks: AtomicU64,
    /// Network namespaces the host made for helpers so far: from the pool, and by helpers
    /// that asked when the pool was empty.
    pooled_networks: AtomicU64,
    helper_networks: AtomicU64,
    /// The process tier's view templates its helpers' sandboxes clone.
    templates: crate::view_template::ViewTemplates,
}

impl Zygote {
    /// Starts `helper --zygote` from a keeper thread of its own.
    pub fn start(helper: &Path) -> io::Result<Zygote> {
        let (ours, theirs) = sys::socketpair()?;
        let theirs = sys::dup_above(&theirs, SPEC_FD + 8)?;
        let helper = helper.to_owned();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let keeper = std::thread::Builder::new()
            .name("airlock-zygote".to_owned())
            .spawn(move || {
                let spawned =
                    sys::spawn_with_args(&helper, &[ZYGOTE_ARG], &[(theirs.as_raw_fd(), SPEC_FD)]);
                drop(theirs);
                let pid = match spawned {
                    Ok(pid) => pid,
                    Err(err) => {
                        let _ = started_tx.send(Err(err));
                        return;
                    }
                };
                let _ = started_tx.send(Ok(pid));
                // Alive until the zygote ends: its helpers' parent-death signal is tied to us.
                let _ = sys::waitpid(pid, 0);
            })?;
        let pid = match started_rx.recv() {
            Ok(Ok(pid)) => pid,
            Ok(Err(err)) => {
                let _ = keeper.join();
                return Err(err);
            }
            Err(_) => {
                let _ = keeper.join();
                return Err(io::Error::other("the zygote's keeper thread ended"));
            }
        };
        Ok(Zygote {
            channel: Mutex::new(Some(ours)),
            pid,
            keeper: Some(keeper),
            forks: AtomicU64::new(0),
            pooled_networks: AtomicU64::new(0),
            helper_networks: AtomicU64::new(0),
            templates: crate::view_template::ViewTemplates::default(),
        })
    }

    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// How many helpers this zygote has forked.
    pub fn forks(&self) -> u64 {
        self.forks.load(Ordering::Relaxed)
    }

    /// How many helpers got a network namespace the host made: from the pool, and made by
    /// the helper because the pool was empty.
    pub fn host_networks(&self) -> crate::network_pool::HostNetworks {
        crate::network_pool::HostNetworks {
            pooled: self.pooled_networks.load(Ordering::Relaxed),
            made_by_helper: self.helper_networks.load(Ordering::Relaxed),
        }
    }

    /// The view templates of this zygote's sandboxes.
    pub fn view_templates(&self) -> &crate::view_template::ViewTemplates {
        &self.templates
    }

    /// Asks the pooler for one namespace: call once for each pooled namespace a helper got, when
    /// its sandbox has started or ended.
    pub(crate) fn refill(&self) {
        let guard = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = guard.as_ref() {
            // A zygote that is gone has no pool to refill.
            let _ = scm::send_with_fds(channel, &[REFILL], &[]);
        }
    }

    /// Forks a helper with `fds` (`(descriptor, target)` pairs) installed, and with a pooled
    /// network namespace if `network` and one is ready; returns its pid, a child of this
    /// process, and whether it got the namespace (then [`Zygote::refill`] is owed).
    pub(crate) fn spawn(
        &self,
        fds: &[(RawFd, RawFd)],
        network: bool,
    ) -> io::Result<(libc::pid_t, bool)> {
        let mut mask = if network { NETWORK_WANTED } else { 0 };
        let mut ordered = Vec::with_capacity(TARGETS.len());
        for (bit, target) in TARGETS.iter().enumerate() {
            if let Some(&(fd, _)) = fds.iter().find(|(_, t)| t == target) {
                mask |= 1 << bit;
                ordered.push(fd);
            }
        }
        if ordered.len() != fds.len() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let guard = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        let channel = guard
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EPIPE))?;
        scm::send_with_fds(channel, &[mask], &ordered)?;
        let mut answer = [0u8; 8];
        let n = sys::recv(channel, &mut answer)?;
        let (pid, pooled) = decode_answer(&answer[..n])?;
        self.forks.fetch_add(1, Ordering::Relaxed);
        if pooled {
            self.pooled_networks.fetch_add(1, Ordering::Relaxed);
        } else if network {
            self.helper_networks.fetch_add(1, Ordering::Relaxed);
        }
        Ok((pid, pooled))
    }
}

fn decode_answer(answer: &[u8]) -> io::Result<(libc::pid_t, bool)> {
    match answer {
        [b'P', a, b, c, d, pooled @ (0 | 1)] => {
            Ok((i32::from_le_bytes([*a, *b, *c, *d]), *pooled == 1))
        }
        [b'E', errno @ ..] if errno.len() == 4 => {
            Err(io::Error::from_raw_os_error(i32::from_le_bytes([
                errno[0], errno[1], errno[2], errno[3],
            ])))
        }
        [] => Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the zygote is gone",
        )),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the zygote's answer is malformed",
        )),
    }
}

impl Drop for Zygote {
    /// Closing the socket ends the zygote; the keeper reaps it. Helpers already forked are the
    /// runtime's children and are not touched.
    fn drop(&mut self) {
        drop(
            self.channel
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
    }
}

/// The zygote's side: serves requests on [`SPEC_FD`] until the runtime closes it. Returns the
/// zygote's exit code; in a forked helper it never returns. `argument` is the process's
/// `--zygote` argument, blanked in each helper so that `ps` shows it as a plain helper.
pub fn serve(argument: &'static mut [u8]) -> i32 {
    // The zygote dies with its keeper thread (the runtime); its helpers arm their own signal.
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    let _ = sys::close_from(SPEC_FD + 1, &[]);
    // SAFETY: the runtime placed the request socket at SPEC_FD for us alone.
    let channel = unsafe { OwnedFd::from_raw_fd(SPEC_FD) };
    let pool = Pool::start(&channel);
    loop {
        let (message, fds) = match scm::recv_with_fds(&channel, 8) {
            Ok(received) => received,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) if err.kind() == io::ErrorKind::InvalidData => {
                let _ = reply_error(&channel, libc::EINVAL);
                continue;
            }
            Err(_) => return 1,
        };
        let Some(&mask) = message.first() else {
            // The runtime closed its end.
            return 0;
        };
        if message == [REFILL] && fds.is_empty() {
            if let Some(pool) = &pool {
                pool.credit();
            }
            continue;
        }
        let targets: Vec<RawFd> = TARGETS
            .iter()
            .enumerate()
            .filter(|(bit, _)| mask & (1 << bit) != 0)
            .map(|(_, target)| *target)
            .collect();
        let fd_bits = mask & !NETWORK_WANTED;
        if message.len() != 1 || fd_bits >> TARGETS.len() != 0 || targets.len() != fds.len() {
            let _ = reply_error(&channel, libc::EINVAL);
            continue;
        }
        let mut network = if mask & NETWORK_WANTED != 0 {
            pool.as_ref().and_then(Pool::take)
        } else {
            None
        };
        match sys::fork_into(libc::CLONE_PARENT) {
            Ok(Forked::Child) => {
                argument.fill(0);
                if let Some(pool) = pool {
                    pool.leave();
                }
                sys::exit_now(become_helper(channel, fds, &targets, network))
            }
            Ok(Forked::Parent(pid)) => {
                drop(fds);
                let pooled = network.take().is_some();
                let mut answer = vec![b'P'];
                answer.extend_from_slice(&pid.to_le_bytes());
                answer.push(u8::from(pooled));
                if scm::send_with_fds(&channel, &answer, &[]).is_err() {
                    return 1;
                }
            }
            Err(err) => {
                drop(fds);
                let _ = reply_error(&channel, err.raw_os_error().unwrap_or(libc::EIO));
            }
        }
    }
}

fn reply_error(channel: &OwnedFd, errno: i32) -> io::Result<()> {
    let mut answer = vec![b'E'];
    answer.extend_from_slice(&errno.to_le_bytes());
    scm::send_with_fds(channel, &answer, &[])
}

/// In the forked child: the request's descriptors at their numbers (and a pooled network
/// namespace's), the zygote's socket closed, then the helper as if freshly exec'd.
fn become_helper(
    channel: OwnedFd,
    mut fds: Vec<OwnedFd>,
    targets: &[RawFd],
    network: Option<Network>,
) -> i32 {
    drop(channel);
    let mut targets = targets.to_vec();
    if let Some(network) = network {
        fds.extend([network.netns, network.sysfs]);
        targets.extend([NETNS_FD, SYSFS_FD]);
    }
    // Above every target first, so that installing one cannot clobber another.
    let high: io::Result<Vec<OwnedFd>> = fds
        .iter()
        .map(|fd| sys::dup_above(fd, SPEC_FD + 8))
        .collect();
    drop(fds);
    let Ok(high) = high else {
        return crate::helper::SETUP_FAILED;
    };
    for (fd, &target) in high.iter().zip(&targets) {
        if crate::procctl::dup_inheritable(fd.as_raw_fd(), target).is_err() {
            return crate::helper::SETUP_FAILED;
        }
    }
    drop(high);
    crate::helper::main_with_descriptors()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_answers_carry_the_pid_and_whether_a_pooled_network_was_installed() {
        let mut answer = vec![b'P'];
        answer.extend_from_slice(&4242i32.to_le_bytes());
        assert_eq!(
            decode_answer(&[answer.as_slice(), &[1]].concat()).unwrap(),
            (4242, true)
        );
        assert_eq!(
            decode_answer(&[answer.as_slice(), &[0]].concat()).unwrap(),
            (4242, false)
        );
        for bad in [answer.clone(), [answer.as_slice(), &[2]].concat()] {
            let err = decode_answer(&bad).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{bad:?}");
        }
        let mut refused = vec![b'E'];
        refused.extend_from_slice(&libc::EINVAL.to_le_bytes());
        assert_eq!(
            decode_answer(&refused).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}

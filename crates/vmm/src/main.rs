//! `airlock-vmm`: the VMM as its own process, run fresh (and inside the process tier's jail)
//! for each VM. Today it runs the freestanding counter guest:
//!
//! - `airlock-vmm template --snapshot DIR --steps N`: boots the guest, lets it count N times
//!   and writes its snapshot to DIR (before any filter: it creates files);
//! - `airlock-vmm fork --snapshot DIR --identity K --steps N`: maps the snapshot
//!   copy-on-write, restores it, gives the fork identity K (the step it counts by), installs
//!   the VMM's seccomp allow-list, runs N steps and prints `counter: V` (the counter's value
//!   as the guest printed it, low byte, then in full from memory);
//! - `airlock-vmm fork ... --then-open PATH`: the same, then tries to open PATH, which the
//!   allow-list answers by killing the process (the proof that the filter is in force).
//!
//! - `airlock-vmm linux --kernel VMLINUX [--initrd FILE] [--cmdline TEXT] [--memory-mib N]`:
//!   boots a Linux guest through its PVH entry with a virtio-rng device, its console on this
//!   process's standard output, until the guest reboots or shuts down (`reboot=t` or
//!   `reboot=k`); `--cmdline-devices` also declares the devices as `virtio_mmio.device=`;
//!   `--vsock-socket PATH [--guest-cid N]` adds a vsock device (CID 3 by default) whose host
//!   side listens on PATH (`CONNECT <port>\n`, Firecracker's convention). With
//!   `--snapshot DIR`, SIGUSR1 pauses the guest, writes its snapshot to DIR and exits 0;
//!   each writable `--disk` N is then copied (holes kept) to DIR/disk-N.img, the disk of that
//!   snapshot, which a restore (or a copy per fork) is given back with `--disk`.
//!   Without `--snapshot` the VMM's allow-list is installed (on all threads) before the guest
//!   first runs;
//!   `--save-memory FILE --save-state FILE` (both existing files; in `linux` and `restore`)
//!   is how a jailed VMM snapshots: the two are opened and the memory file sized before the
//!   allow-list, and SIGUSR1 then pauses the guest, writes its memory (zero pages as holes)
//!   and its state into them with positioned writes, and exits 0. The caller names them
//!   `memory` and `state.json` (and keeps the disks: the VMM has ended, so they are the
//!   snapshot's as they are);
//!   `--disk PATH[:ro][:id=SERIAL]` (repeatable) adds a virtio-blk device on that raw disk
//!   file, after the entropy and vsock devices, in order (the guest's `/dev/vda`, `vdb`, ...;
//!   its serial, `airlock-disk-N` by default, in `/sys/block/vdX/serial`);
//! - `airlock-vmm restore --snapshot DIR [--vsock-socket PATH] [--disk ...]`: resumes such a
//!   snapshot (given the same disks in the same order, each of the size and mode it had)
//!   under the allow-list
//!   (memory mapped copy-on-write) where it stopped; vsock connections do not survive it (the
//!   guest gets a transport reset), so the host connects again.
//!
//! - `airlock-vmm restore --shell ...`: a pre-created VM shell. Everything a restore can do
//!   ahead is done (the VM, irqchip, PIT, vCPU and irqfds created, the snapshot read, disks
//!   and snapshot files opened), then the VMM waits: the first connection on its vsock socket
//!   is its owner's, whose `restore` line makes it restore the snapshot there and answer
//!   `restored <microseconds>` (`airlock_vmm::shell_control`); later connections reach the
//!   guest as usual. How a warm pool of a microvm snapshot holds its members.
//!
//! `--vsock-listen-fd N` takes the vsock device's host socket from an inherited listening
//! Unix socket N instead of binding `--vsock-socket`, and `--vsock-port P` sends every
//! connection on it to guest port P without the `CONNECT` handshake (no `OK` line either):
//! the microvm tier's jail binds the agent's socket on the host, and the daemon speaks the
//! agent's HTTP on it exactly as on the process tier's.
//!
//! `--vsock-forward PORT:PATH` (repeatable, `linux` and `restore`) lets the guest connect to
//! the host (CID 2) on PORT: the VMM connects to the Unix socket at PATH and carries the
//! stream; a guest connection to any other host port gets a reset. The microvm tier forwards
//! the egress proxy's port this way, to the proxy's socket in the VMM's view.
//!
//! `--kvm-fd N` takes `/dev/kvm` from inherited descriptor N instead of opening it: how the
//! VMM runs inside the process tier's jail, whose view has no `/dev/kvm` and whose user could
//! not open it (the caller opens it; Landlock's device-ioctl right follows the opener).
//!
//! Exit status 0 when the run did what was asked; an error is printed on one line, 1.

use std::path::PathBuf;
use std::process::ExitCode;

use airlock_vmm::fork::Template;
use airlock_vmm::guest_code::{self, CODE_ADDRESS, COUNTER_ADDRESS};
use airlock_vmm::linux::LinuxBoot;
use airlock_vmm::virtio::block::{Block, Disk, DiskSpec};
use airlock_vmm::virtio::{Device, Forward, HostListener};
use airlock_vmm::vm::{self, Vm, VmConfig, VmExit, VmShell, Vmm};
use airlock_vmm::{seccomp, shell_control, snapshot};
use anyhow::{Context, bail};

struct Args {
    mode: String,
    snapshot: PathBuf,
    steps: u64,
    identity: u64,
    then_open: Option<PathBuf>,
    kvm_fd: Option<i32>,
    kernel: Option<PathBuf>,
    initrd: Option<PathBuf>,
    cmdline: String,
    memory_mib: u64,
    cmdline_devices: bool,
    vsock_socket: Option<PathBuf>,
    vsock_listen_fd: Option<i32>,
    vsock_port: Option<u32>,
    guest_cid: u64,
    forwards: Vec<Forward>,
    disks: Vec<DiskSpec>,
    save_memory: Option<PathBuf>,
    save_state: Option<PathBuf>,
    shell: bool,
}

/// Where SIGUSR1's snapshot goes, if anywhere.
enum Save<'a> {
    /// No snapshot: SIGUSR1 is not handled, the allow-list is installed.
    Never,
    /// Created in this directory, so without the allow-list (the template and the rig).
    Dir(&'a std::path::Path),
    /// Into files opened before the allow-list, which is installed.
    Files(snapshot::SaveFiles),
}

fn parse() -> anyhow::Result<Args> {
    let mut args = std::env::args().skip(1);
    let mode = args
        .next()
        .context("usage: airlock-vmm template|fork --snapshot DIR ...")?;
    let mut parsed = Args {
        mode,
        snapshot: PathBuf::new(),
        steps: 3,
        identity: 1,
        then_open: None,
        kvm_fd: None,
        kernel: None,
        initrd: None,
        cmdline: "console=ttyS0 reboot=t panic=-1".into(),
        memory_mib: 256,
        cmdline_devices: false,
        vsock_socket: None,
        vsock_listen_fd: None,
        vsock_port: None,
        guest_cid: 3,
        forwards: Vec::new(),
        disks: Vec::new(),
        save_memory: None,
        save_state: None,
        shell: false,
    };
    while let Some(flag) = args.next() {
        if flag == "--cmdline-devices" {
            parsed.cmdline_devices = true;
            continue;
        }
        if flag == "--shell" {
            parsed.shell = true;
            continue;
        }
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--snapshot" => parsed.snapshot = PathBuf::from(value),
            "--steps" => parsed.steps = value.parse().context("--steps")?,
            "--identity" => parsed.identity = value.parse().context("--identity")?,
            "--then-open" => parsed.then_open = Some(PathBuf::from(value)),
            "--kvm-fd" => parsed.kvm_fd = Some(value.parse().context("--kvm-fd")?),
            "--kernel" => parsed.kernel = Some(PathBuf::from(value)),
            "--initrd" => parsed.initrd = Some(PathBuf::from(value)),
            "--cmdline" => parsed.cmdline = value,
            "--memory-mib" => parsed.memory_mib = value.parse().context("--memory-mib")?,
            "--vsock-socket" => parsed.vsock_socket = Some(PathBuf::from(value)),
            "--guest-cid" => parsed.guest_cid = value.parse().context("--guest-cid")?,
            "--disk" => parsed
                .disks
                .push(DiskSpec::parse(&value, parsed.disks.len())?),
            "--vsock-listen-fd" => {
                parsed.vsock_listen_fd = Some(value.parse().context("--vsock-listen-fd")?);
            }
            "--vsock-port" => parsed.vsock_port = Some(value.parse().context("--vsock-port")?),
            "--save-memory" => parsed.save_memory = Some(PathBuf::from(value)),
            "--save-state" => parsed.save_state = Some(PathBuf::from(value)),
            "--vsock-forward" => parsed
                .forwards
                .push(Forward::parse(&value).context("--vsock-forward")?),
            other => bail!("unknown flag {other}"),
        }
    }
    if parsed.vsock_socket.is_some() && parsed.vsock_listen_fd.is_some() {
        bail!("give --vsock-socket or --vsock-listen-fd, not both");
    }
    if parsed.vsock_port.is_some()
        && parsed.vsock_socket.is_none()
        && parsed.vsock_listen_fd.is_none()
    {
        bail!("--vsock-port needs --vsock-socket or --vsock-listen-fd");
    }
    if parsed.save_memory.is_some() != parsed.save_state.is_some() {
        bail!("give --save-memory and --save-state together");
    }
    if parsed.save_memory.is_some()
        && parsed.mode == "linux"
        && !parsed.snapshot.as_os_str().is_empty()
    {
        bail!("give --snapshot DIR or --save-memory/--save-state, not both");
    }
    if parsed.shell && parsed.mode != "restore" {
        bail!("--shell is for restore only");
    }
    if parsed.shell && parsed.vsock_socket.is_none() && parsed.vsock_listen_fd.is_none() {
        bail!("--shell needs --vsock-socket or --vsock-listen-fd (its owner's connection)");
    }
    Forward::check_unique(&parsed.forwards).context("--vsock-forward")?;
    if parsed.mode == "linux" {
        if parsed.kernel.is_none() {
            bail!("linux needs --kernel VMLINUX");
        }
    } else if parsed.snapshot.as_os_str().is_empty() {
        bail!("--snapshot DIR is required");
    }
    Ok(parsed)
}

fn run_steps(vm: &mut Vm, steps: u64) -> anyhow::Result<()> {
    match vm.run(Some(steps))? {
        VmExit::Paused => Ok(()),
        other => bail!("the guest ended early: {other:?}"),
    }
}

fn main_inner() -> anyhow::Result<()> {
    let args = parse()?;
    let vmm = match args.kvm_fd {
        Some(fd) => Vmm::from_inherited_fd(fd)?,
        None => Vmm::new()?,
    };
    match args.mode.as_str() {
        "template" => {
            let config = VmConfig {
                memory_bytes: 2 << 20,
                entry: CODE_ADDRESS,
                image: vec![(CODE_ADDRESS, guest_code::counter_loop())],
                entropy_device: true,
            };
            let mut vm = Vm::boot(
                &vmm,
                VmShell::create(&vmm, 1, config.memory_bytes)?,
                &config,
            )?;
            vm.set_identity(1)?;
            run_steps(&mut vm, args.steps)?;
            snapshot::save(&mut vm, &args.snapshot)?;
            println!("template: {} steps", args.steps);
        }
        "fork" => {
            let template = Template::from_snapshot(snapshot::load(&args.snapshot)?);
            let mut vm = template.fork(&vmm, None)?;
            vm.set_identity(args.identity)?;
            seccomp::install()?;
            run_steps(&mut vm, args.steps)?;
            let bytes = snapshot::read_guest(&vm, u64::from(COUNTER_ADDRESS), 4)?;
            let value = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            let printed: Vec<String> = vm.console().contents().iter().map(u8::to_string).collect();
            println!("printed: {}", printed.join(" "));
            println!("counter: {value}");
            if let Some(path) = args.then_open {
                // Killed here by the filter (SIGSYS) if it holds.
                let opened = std::fs::File::open(&path);
                println!("opened {}: {}", path.display(), opened.is_ok());
            }
        }
        "linux" => run_linux(&vmm, &args)?,
        "restore" => run_restore(&vmm, &args)?,
        other => bail!("unknown mode {other} (template, fork, linux or restore)"),
    }
    Ok(())
}

/// The vsock device's host socket: bound at `--vsock-socket` (replacing a stale one) or
/// inherited (`--vsock-listen-fd`); `None` without either.
fn vsock_listener(args: &Args) -> anyhow::Result<Option<HostListener>> {
    let listener = match (&args.vsock_socket, args.vsock_listen_fd) {
        (Some(path), _) => {
            let _ = std::fs::remove_file(path);
            std::os::unix::net::UnixListener::bind(path)
                .with_context(|| format!("binding {}", path.display()))?
        }
        (None, Some(fd)) => {
            airlock_vmm::virtio::vsock_host::inherited_listener(fd).context("--vsock-listen-fd")?
        }
        (None, None) => return Ok(None),
    };
    Ok(Some(HostListener {
        listener,
        guest_port: args.vsock_port,
    }))
}

/// The snapshot files of `--save-memory`/`--save-state`, opened now (before the allow-list)
/// for a guest of `memory_bytes`.
fn save_files(args: &Args, memory_bytes: u64) -> anyhow::Result<Option<snapshot::SaveFiles>> {
    match (&args.save_memory, &args.save_state) {
        (Some(memory), Some(state)) => Ok(Some(snapshot::SaveFiles::open(
            memory,
            state,
            memory_bytes,
        )?)),
        _ => Ok(None),
    }
}

/// Runs a Linux guest until it ends, or (with a place to save to) until SIGUSR1, then
/// snapshots it; true when it did. The vsock host thread is started with SIGUSR1 blocked, so
/// the signal interrupts the vCPU. `forwards` are the host ports the guest may connect to.
fn run_guest(
    mut vm: Vm,
    listener: Option<HostListener>,
    forwards: Vec<Forward>,
    save: Save<'_>,
) -> anyhow::Result<bool> {
    vm.console().echo_to_stdout();
    if !matches!(save, Save::Never) {
        airlock_vmm::pause::install_sigusr1()?;
    }
    if listener.is_some() || !forwards.is_empty() {
        airlock_vmm::pause::spawn_without_sigusr1(|| vm.start_vsock_host(listener, forwards))??;
    }
    // The allow-list, on the vsock thread too; not with a snapshot directory to create at
    // the end (the guest is then confined by KVM alone, the VMM by the caller).
    if !matches!(save, Save::Dir(_)) {
        seccomp::install_all_threads()?;
    }
    let exit = vm.run(None)?;
    eprintln!("airlock-vmm: the guest ended: {exit:?}");
    if exit != VmExit::Paused {
        return Ok(false);
    }
    match save {
        Save::Never => Ok(false),
        Save::Dir(dir) => {
            snapshot::save(&mut vm, dir)?;
            eprintln!("airlock-vmm: snapshot written to {}", dir.display());
            Ok(true)
        }
        Save::Files(files) => {
            let written = snapshot::save_to(&mut vm, &files)?;
            eprintln!("airlock-vmm: snapshot written ({written} bytes of memory)");
            Ok(true)
        }
    }
}

fn run_linux(vmm: &Vmm, args: &Args) -> anyhow::Result<()> {
    let mut devices = vec![Device::Rng(airlock_vmm::virtio::Rng::new())];
    let listener = vsock_listener(args)?;
    if listener.is_some() || !args.forwards.is_empty() {
        devices.push(Device::Vsock(airlock_vmm::virtio::Vsock::new(
            args.guest_cid,
            None,
        )));
    }
    for spec in &args.disks {
        devices.push(Device::Block(Block::open(spec)?));
    }
    let mut cmdline = args.cmdline.clone();
    if args.cmdline_devices {
        cmdline = format!("{cmdline} {}", vm::virtio_cmdline_devices(devices.len()));
    }
    let boot = LinuxBoot {
        kernel: args.kernel.clone().context("--kernel")?,
        initrd: args.initrd.clone(),
        cmdline,
    };
    let shell = VmShell::create(vmm, devices.len(), args.memory_mib << 20)?;
    let vm = Vm::boot_linux(vmm, shell, &boot, devices)?;
    eprintln!("airlock-vmm: booting {}", boot.kernel.display());
    let snapshot_dir = (!args.snapshot.as_os_str().is_empty()).then_some(args.snapshot.as_path());
    let save = match (snapshot_dir, save_files(args, args.memory_mib << 20)?) {
        (Some(dir), _) => Save::Dir(dir),
        (None, Some(files)) => Save::Files(files),
        (None, None) => Save::Never,
    };
    if run_guest(vm, listener, args.forwards.clone(), save)? {
        // The writable disks as the paused guest left them belong to the snapshot.
        for (index, spec) in args.disks.iter().enumerate() {
            let (Some(dir), false) = (snapshot_dir, spec.read_only) else {
                continue;
            };
            let copy = dir.join(format!("disk-{index}.img"));
            snapshot::copy_disk(&spec.path, &copy)?;
            eprintln!("airlock-vmm: disk {index} copied to {}", copy.display());
        }
    }
    Ok(())
}

fn run_restore(vmm: &Vmm, args: &Args) -> anyhow::Result<()> {
    let listener = vsock_listener(args)?;
    let template = Template::from_snapshot(snapshot::load(&args.snapshot)?);
    let disks = args
        .disks
        .iter()
        .map(|spec| Disk::open(&spec.path, spec.read_only))
        .collect::<Result<Vec<_>, _>>()?;
    let save = save_files(args, template.state.memory_bytes)?.map_or(Save::Never, Save::Files);
    let restore = |shell| -> anyhow::Result<Vm> {
        let mut vm = template.fork(vmm, shell)?;
        vm.attach_disks(disks)?;
        Ok(vm)
    };
    let vm = match (&listener, args.shell) {
        (Some(listener), true) => {
            let shell =
                VmShell::create(vmm, template.virtio_devices(), template.state.memory_bytes)?;
            eprintln!("airlock-vmm: shell ready for {}", args.snapshot.display());
            let control = shell_control::await_restore(&listener.listener)?;
            let started = std::time::Instant::now();
            match restore(Some(shell)) {
                Ok(vm) => {
                    shell_control::answer(control, Ok(started.elapsed()))?;
                    vm
                }
                Err(err) => {
                    let _ = shell_control::answer(control, Err(&format!("{err:#}")));
                    return Err(err);
                }
            }
        }
        _ => restore(None)?,
    };
    eprintln!("airlock-vmm: restored {}", args.snapshot.display());
    run_guest(vm, listener, args.forwards.clone(), save).map(|_| ())
}

fn main() -> ExitCode {
    // Before any thread exists (see the function).
    seccomp::single_malloc_arena();
    match main_inner() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("airlock-vmm: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

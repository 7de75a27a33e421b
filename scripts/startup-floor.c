/*
 * startup-floor: how fast can any sandbox with Airlock's layers start on this host?
 *
 * A deliberately minimal sandbox, written straight against the kernel: new user, mount, pid,
 * cgroup, network, ipc and uts namespaces (loopback up), a read-only view on a tmpfs root with
 * masks, fresh /proc, /sys, a minimal /dev, private /tmp and /workspace, pivot_root, memory, pids
 * and cpu cgroup limits, capabilities dropped, no_new_privs, Landlock and a seccomp deny-list. It
 * then runs /bin/true and tears everything down. It measures that cycle, interleaved with the
 * same bwrap command as `airlock bench start` and a bare fork+exec of /bin/true.
 *
 * It does less than Airlock, on purpose, so that its figure is a lower bound:
 *   - no helper is exec'd: the sandbox is a fork of this single-threaded program;
 *   - no policy, no spec, no report channel, a fixed mask list, four Landlock rules;
 *   - the network namespace is built in a thread in parallel with the view, as Airlock does.
 *
 * Build and run as root (cgroup v1 memory, pids and cpu controllers, or cgroup v2):
 *   gcc -O2 -o /tmp/startup-floor scripts/startup-floor.c -lpthread && /tmp/startup-floor 300
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/mount.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) < 0) {                                                                          \
            perror(#call);                                                                         \
            _exit(99);                                                                             \
        }                                                                                          \
    } while (0)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, text, strlen(text)) < 0) {
        perror(path);
        _exit(98);
    }
    close(fd);
}

/* cgroups: v1 controllers if mounted separately, else the v2 hierarchy. */
static int cgroup_v1;
static pid_t owner;
static const char *v1_controllers[] = {"memory", "pids", "cpu", NULL};

static void cgroup_path(char *out, size_t size, const char *controller, int id, const char *file) {
    /* The pid keeps two runs, or a crashed earlier one, from colliding. */
    if (cgroup_v1)
        snprintf(out, size, "/sys/fs/cgroup/%s/startup-floor-%d-%d/%s", controller, owner, id,
                 file);
    else
        snprintf(out, size, "/sys/fs/cgroup/startup-floor-%d-%d/%s", owner, id, file);
}

static void cgroup_create(int id) {
    char path[256];
    if (cgroup_v1) {
        for (int i = 0; v1_controllers[i]; i++) {
            cgroup_path(path, sizeof path, v1_controllers[i], id, "");
            CHECK(mkdir(path, 0755));
        }
        cgroup_path(path, sizeof path, "memory", id, "memory.limit_in_bytes");
        write_file(path, "536870912");
        cgroup_path(path, sizeof path, "pids", id, "pids.max");
        write_file(path, "256");
        cgroup_path(path, sizeof path, "cpu", id, "cpu.cfs_quota_us");
        write_file(path, "150000");
    } else {
        cgroup_path(path, sizeof path, "", id, "");
        CHECK(mkdir(path, 0755));
        cgroup_path(path, sizeof path, "", id, "memory.max");
        write_file(path, "536870912");
        cgroup_path(path, sizeof path, "", id, "pids.max");
        write_file(path, "256");
        cgroup_path(path, sizeof path, "", id, "cpu.max");
        write_file(path, "150000 100000");
    }
}

static void cgroup_join(int id) {
    char path[256];
    if (cgroup_v1)
        for (int i = 0; v1_controllers[i]; i++) {
            cgroup_path(path, sizeof path, v1_controllers[i], id, "tasks");
            write_file(path, "0");
        }
    else {
        cgroup_path(path, sizeof path, "", id, "cgroup.procs");
        write_file(path, "0");
    }
}

static void cgroup_leave(void) {
    char path[256];
    if (cgroup_v1)
        for (int i = 0; v1_controllers[i]; i++) {
            snprintf(path, sizeof path, "/sys/fs/cgroup/%s/tasks", v1_controllers[i]);
            write_file(path, "0");
        }
    else
        write_file("/sys/fs/cgroup/cgroup.procs", "0");
}

static void cgroup_remove(int id) {
    char path[256];
    if (cgroup_v1)
        for (int i = 0; v1_controllers[i]; i++) {
            cgroup_path(path, sizeof path, v1_controllers[i], id, "");
            rmdir(path);
        }
    else {
        cgroup_path(path, sizeof path, "", id, "");
        rmdir(path);
    }
}

/* The network, ipc and uts namespaces, built by a thread while init builds the view. */
static void *build_network(void *out) {
    int *fds = out;
    CHECK(unshare(CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS));
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq request;
    memset(&request, 0, sizeof request);
    strcpy(request.ifr_name, "lo");
    CHECK(ioctl(sock, SIOCGIFFLAGS, &request));
    request.ifr_flags |= IFF_UP;
    CHECK(ioctl(sock, SIOCSIFFLAGS, &request));
    close(sock);
    CHECK(sethostname("airlock", 7));
    fds[0] = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    fds[1] = open("/proc/thread-self/ns/ipc", O_RDONLY | O_CLOEXEC);
    fds[2] = open("/proc/thread-self/ns/uts", O_RDONLY | O_CLOEXEC);
    return NULL;
}

static void attach_clone(int dirfd, const char *source, const char *target, int recursive) {
    int tree = syscall(SYS_open_tree, dirfd, source,
                       OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (recursive ? AT_RECURSIVE : 0));
    CHECK(tree);
    CHECK(syscall(SYS_move_mount, tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH));
    close(tree);
}

static int provided(const char *name) {
    static const char *names[] = {"proc", "sys", "dev", "tmp", "workspace", "run", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(name, names[i]))
            return 1;
    return 0;
}

/* The view, staged on a tmpfs at /tmp of this mount namespace, up to what needs the network. */
static void build_view(void) {
    char path[512], link[512];
    CHECK(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL));
    CHECK(mount("floor", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m"));
    int root = open("/", O_PATH | O_CLOEXEC);
    DIR *dir = opendir("/");
    for (struct dirent *entry; (entry = readdir(dir));) {
        const char *name = entry->d_name;
        if (name[0] == '.' || provided(name))
            continue;
        snprintf(path, sizeof path, "/tmp/%s", name);
        if (entry->d_type == DT_LNK) {
            ssize_t n = readlinkat(root, name, link, sizeof link - 1);
            if (n > 0) {
                link[n] = 0;
                symlink(link, path);
            }
        } else if (entry->d_type == DT_DIR) {
            mkdir(path, 0755);
            attach_clone(root, name, path, 1);
        }
    }
    closedir(dir);
    static const char *made[] = {"proc", "sys", "dev", "tmp", "workspace", "run", NULL};
    for (int i = 0; made[i]; i++) {
        snprintf(path, sizeof path, "/tmp/%s", made[i]);
        mkdir(path, 0755);
    }
    mkdir("/tmp/.mask-dir", 0);
    close(open("/tmp/.mask-file", O_CREAT | O_WRONLY | O_CLOEXEC, 0));
    static const char *masks[] = {"etc/shadow", "etc/gshadow", "root/.ssh",   "root/.aws",
                                  "root/.docker", "root/.kube", "root/.gnupg", "root/.netrc",
                                  "root/.config/gh", NULL};
    for (int i = 0; masks[i]; i++) {
        struct stat info;
        snprintf(path, sizeof path, "/tmp/%s", masks[i]);
        if (lstat(path, &info))
            continue;
        attach_clone(AT_FDCWD, S_ISDIR(info.st_mode) ? "/tmp/.mask-dir" : "/tmp/.mask-file", path,
                     0);
    }
    struct mount_attr read_only = {.attr_set =
                                       MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
    CHECK(syscall(SYS_mount_setattr, AT_FDCWD, "/tmp", AT_RECURSIVE, &read_only,
                  sizeof read_only));
    CHECK(mount("proc", "/tmp/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL));
    CHECK(mount("tmpfs", "/tmp/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k"));
    static const char *devices[] = {"null", "zero", "full", "random", "urandom", "tty", NULL};
    for (int i = 0; devices[i]; i++) {
        char source[64];
        snprintf(path, sizeof path, "/tmp/dev/%s", devices[i]);
        snprintf(source, sizeof source, "/dev/%s", devices[i]);
        close(open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
        CHECK(mount(source, path, NULL, MS_BIND, NULL));
    }
    mkdir("/tmp/dev/pts", 0755);
    mkdir("/tmp/dev/shm", 01777);
    symlink("pts/ptmx", "/tmp/dev/ptmx");
    symlink("/proc/self/fd", "/tmp/dev/fd");
    CHECK(mount("devpts", "/tmp/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                "newinstance,ptmxmode=0666"));
    CHECK(mount("tmpfs", "/tmp/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777"));
    CHECK(mount("tmpfs", "/tmp/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777"));
    CHECK(mount("tmpfs", "/tmp/workspace", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755"));
}

static void finish_view(void) {
    mount("sysfs", "/tmp/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, NULL);
    CHECK(chdir("/tmp"));
    CHECK(syscall(SYS_pivot_root, ".", "."));
    CHECK(umount2(".", MNT_DETACH));
    CHECK(chdir("/"));
}

static void landlock_rule(int ruleset, const char *path, __u64 rights) {
    struct landlock_path_beneath_attr rule = {.allowed_access = rights};
    rule.parent_fd = open(path, O_PATH | O_CLOEXEC);
    CHECK(rule.parent_fd);
    CHECK(syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0));
    close(rule.parent_fd);
}

static void apply_landlock(void) {
    const __u64 all = (1ULL << 13) - 1; /* ABI 1 rights */
    struct landlock_ruleset_attr attr = {.handled_access_fs = all};
    int ruleset = syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    CHECK(ruleset);
    const __u64 read = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE |
                       LANDLOCK_ACCESS_FS_READ_DIR;
    landlock_rule(ruleset, "/", read);
    landlock_rule(ruleset, "/tmp", all);
    landlock_rule(ruleset, "/workspace", all);
    landlock_rule(ruleset, "/dev/null", LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE);
    CHECK(syscall(SYS_landlock_restrict_self, ruleset, 0));
    close(ruleset);
}

static void apply_seccomp(void) {
    static const int denied[] = {
        SYS_ptrace,       SYS_process_vm_readv, SYS_process_vm_writev, SYS_bpf,
        SYS_perf_event_open, SYS_userfaultfd,  SYS_io_uring_setup,    SYS_io_uring_enter,
        SYS_io_uring_register, SYS_mount,      SYS_umount2,           SYS_pivot_root,
        SYS_open_tree,    SYS_move_mount,       SYS_fsopen,            SYS_fsconfig,
        SYS_fsmount,      SYS_fspick,           SYS_mount_setattr,     SYS_setns,
        SYS_keyctl,       SYS_add_key,          SYS_request_key,       SYS_kexec_load,
        SYS_kexec_file_load, SYS_init_module,   SYS_finit_module,      SYS_delete_module,
        SYS_reboot,       SYS_swapon,           SYS_swapoff,           SYS_acct,
        SYS_iopl,         SYS_ioperm,           SYS_settimeofday,      SYS_clock_settime,
        SYS_adjtimex,     SYS_personality,
    };
    enum { COUNT = sizeof denied / sizeof denied[0] };
    struct sock_filter filter[COUNT + 6];
    int n = 0;
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4);
    filter[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0);
    for (int i = 0; i < COUNT; i++)
        filter[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, denied[i], COUNT - i, 0);
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    filter[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 1);
    struct sock_fprog program = {.len = n, .filter = filter};
    CHECK(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program));
}

static int init_main(int socket_fd) {
    int namespaces[3];
    pthread_t network;
    pthread_create(&network, NULL, build_network, namespaces);
    char go[2];
    if (read(socket_fd, go, 2) != 2)
        _exit(90);
    CHECK(setresgid(0, 0, 0));
    CHECK(setresuid(0, 0, 0));
    build_view();
    pthread_join(network, NULL);
    CHECK(setns(namespaces[0], CLONE_NEWNET));
    CHECK(setns(namespaces[1], CLONE_NEWIPC));
    CHECK(setns(namespaces[2], CLONE_NEWUTS));
    finish_view();
    for (int cap = 0; cap <= CAP_LAST_CAP; cap++)
        prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    CHECK(syscall(SYS_setresgid, 1000, 1000, 1000));
    CHECK(syscall(SYS_setresuid, 1000, 1000, 1000));
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};
    CHECK(syscall(SYS_capset, &header, data));
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
    apply_landlock();
    apply_seccomp();
    pid_t workload = fork();
    if (workload == 0) {
        char *argv[] = {"/bin/true", NULL};
        char *envp[] = {"PATH=/usr/bin:/bin", NULL};
        execve(argv[0], argv, envp);
        _exit(127);
    }
    int status;
    waitpid(workload, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static int init_socket[2];
static char init_stack[1 << 16];

static int init_entry(void *unused) {
    (void)unused;
    close(init_socket[0]);
    _exit(init_main(init_socket[1]));
}

static int helper_main(int id) {
    cgroup_join(id);
    CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, init_socket));
    pid_t init = clone(init_entry, init_stack + sizeof init_stack,
                       CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWCGROUP | SIGCHLD, NULL);
    CHECK(init);
    close(init_socket[1]);
    cgroup_leave();
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/uid_map", init);
    write_file(path, "0 1879048192 65536\n");
    snprintf(path, sizeof path, "/proc/%d/gid_map", init);
    write_file(path, "0 1879048192 65536\n");
    CHECK(write(init_socket[0], "go", 2));
    int status;
    waitpid(init, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static double floor_cycle(int id) {
    double start = now_ms();
    cgroup_create(id);
    pid_t helper = fork();
    if (helper == 0)
        _exit(helper_main(id));
    int status;
    waitpid(helper, &status, 0);
    cgroup_remove(id);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "the floor sandbox failed (status %#x)\n", status);
        exit(1);
    }
    return now_ms() - start;
}

static double spawn_cycle(char *const argv[]) {
    double start = now_ms();
    pid_t child;
    if (posix_spawnp(&child, argv[0], NULL, NULL, argv, environ)) {
        perror(argv[0]);
        exit(1);
    }
    int status;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "%s failed (status %#x)\n", argv[0], status);
        exit(1);
    }
    return now_ms() - start;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(double *values, int n, double p) {
    qsort(values, n, sizeof *values, compare);
    return values[(int)(p * (n - 1))];
}

/* `--serve`: one cycle per byte read on stdin, its time in ns written back as a line. This
 * lets `airlock bench start` interleave the floor with its own contenders, in one run, without
 * an exec per cycle (which would no longer make it a floor). */
static int serve(void) {
    char byte;
    int i = 0;
    while (read(0, &byte, 1) == 1) {
        double ms = floor_cycle(i++);
        printf("%.0f\n", ms * 1e6);
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--serve") == 0) {
        struct stat info;
        cgroup_v1 = stat("/sys/fs/cgroup/memory/tasks", &info) == 0;
        owner = getpid();
        return serve();
    }
    int iterations = argc > 1 ? atoi(argv[1]) : 300;
    if (iterations < 10) {
        fprintf(stderr, "usage: %s [ITERATIONS >= 10]\n", argv[0]);
        return 2;
    }
    struct stat info;
    cgroup_v1 = stat("/sys/fs/cgroup/memory/tasks", &info) == 0;
    owner = getpid();
    char *bwrap[] = {"bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
                     "--dev", "/dev", "--proc", "/proc", "true", NULL};
    char *bare[] = {"/bin/true", NULL};
    double *floor = calloc(iterations, sizeof(double));
    double *wrapped = calloc(iterations, sizeof(double));
    double *plain = calloc(iterations, sizeof(double));
    for (int i = -5; i < iterations; i++) {
        double f = floor_cycle(i + 5), w = spawn_cycle(bwrap), p = spawn_cycle(bare);
        if (i >= 0) {
            floor[i] = f;
            wrapped[i] = w;
            plain[i] = p;
        }
    }
    double f50 = percentile(floor, iterations, 0.5), w50 = percentile(wrapped, iterations, 0.5);
    double p50 = percentile(plain, iterations, 0.5);
    printf("%d iterations each, interleaved, after 5 warm-up runs (cgroup %s)\n", iterations,
           cgroup_v1 ? "v1" : "v2");
    printf("contender                         p50 ms    p95 ms\n");
    printf("minimal sandbox, every layer    %8.3f  %8.3f\n", f50, percentile(floor, iterations, 0.95));
    printf("bwrap --unshare-all             %8.3f  %8.3f\n", w50, percentile(wrapped, iterations, 0.95));
    printf("fork+exec+wait /bin/true        %8.3f  %8.3f\n", p50, percentile(plain, iterations, 0.95));
    printf("ratio minimal sandbox / bwrap (p50): %.2fx\n", f50 / w50);
    return 0;
}

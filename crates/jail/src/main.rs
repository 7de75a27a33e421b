//! `airlock-jail`: the confinement helper. Started only by Airlock's supervisor, with its spec on
//! descriptor 3 and its report channel on descriptor 4.
//!
//! It starts once per sandbox, so it skips the Rust runtime's start-up work (the main thread's
//! stack guard, which reads `/proc/self/maps`, the alternate signal stack and the checks of
//! descriptors 0 to 2): about 0.05 ms here.
#![no_main]
#![allow(
    unsafe_code,
    reason = "the C entry point is an unmangled symbol; the jail is allowed unsafe"
)]

// SAFETY: this is the C entry point the C runtime calls once, with the process's arguments; it
// reads neither `argc` nor `argv`, and no other symbol is named `main`.
#[unsafe(no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    airlock_jail::helper::main()
}

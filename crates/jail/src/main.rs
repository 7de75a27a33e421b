//! `airlock-jail`: the confinement helper. Started only by Airlock's supervisor, with its spec on
//! descriptor 3 and its report channel on descriptor 4; or, as `airlock-jail --zygote`, by a
//! long-lived runtime, to fork helpers on request (`airlock_jail::zygote`).
//!
//! It starts once per sandbox, so it skips the Rust runtime's start-up work (the main thread's
//! stack guard, which reads `/proc/self/maps`, the alternate signal stack and the checks of
//! descriptors 0 to 2): about 0.05 ms here.
#![no_main]
#![allow(
    unsafe_code,
    reason = "the C entry point is an unmangled symbol; the jail is allowed unsafe"
)]

use std::ffi::CStr;

use airlock_jail::zygote;

// SAFETY: this is the C entry point the C runtime calls once, with the process's arguments; no
// other symbol is named `main`.
#[unsafe(no_mangle)]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    if argc == 2 {
        // SAFETY: the C runtime passes `argc` valid, NUL-terminated strings in `argv`, which
        // live (in the process's argument area) until it exits; nothing else refers to the
        // second one, so it may be borrowed mutably for the process's life.
        let argument = unsafe {
            let arg = *argv.add(1) as *mut libc::c_char;
            let len = CStr::from_ptr(arg).to_bytes().len();
            std::slice::from_raw_parts_mut(arg.cast::<u8>(), len)
        };
        if *argument == *zygote::ZYGOTE_ARG.to_bytes() {
            return zygote::serve(argument);
        }
    }
    airlock_jail::helper::main()
}

//! `airlock-jail`: the confinement helper. Started only by Airlock's supervisor, with its spec on
//! descriptor 3 and its report channel on descriptor 4.

fn main() {
    std::process::exit(airlock_jail::helper::main());
}

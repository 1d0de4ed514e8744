//! The `forkd` binary: the command line in `forkd::cli`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(forkd::cli::run(&args));
}

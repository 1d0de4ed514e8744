//! The API guide's examples (`docs/api.md`, "Examples") run as written: every `sh` block of
//! that section, in order, as one `bash` script against a fresh server, with `curl` and `jq`
//! as a reader would have them. Each step takes what it needs from an earlier answer, so a
//! step that no longer works breaks the steps after it (a `jq -e` finds no token, no id).

use std::fs;
use std::process::Command;

use crate::util::*;

/// What the script runs first: strict mode; `curl` bounded in time, quiet unless it fails
/// (a `--max-time` the guide gives to stop an event stream is no failure); `forkd` the binary
/// under test with the server's configuration.
const PRELUDE: &str = r#"set -euo pipefail
curl() { command curl --silent --show-error --max-time 10 "$@" || { rc=$?; [ "$rc" -eq 28 ] || return "$rc"; }; }
forkd() { "$EXAMPLES_BIN" "$@" --config "$EXAMPLES_CONFIG"; }
"#;

/// The `sh` blocks of the guide's "Examples" section, in order, with `BASE` pointing at `base`.
fn example_script(guide: &str, base: &str) -> String {
    let section = guide.split_once("\n## Examples").map_or("", |(_, rest)| rest);
    let section = section.split_once("\n## ").map_or(section, |(s, _)| s);
    let mut script = String::from(PRELUDE);
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```sh" {
            continue;
        }
        for l in lines.by_ref().take_while(|l| l.trim() != "```") {
            if l.starts_with("BASE=") {
                script.push_str(&format!("BASE={base}\n"));
            } else {
                script.push_str(l);
                script.push('\n');
            }
        }
    }
    script
}

#[test]
fn the_api_guide_examples_run_as_written() {
    for tool in ["curl", "jq", "bash", "timeout"] {
        if Command::new(tool).arg("--version").output().is_err() {
            eprintln!("{tool} is not installed: skipped");
            return;
        }
    }
    let files = tempfile::tempdir().expect("tempdir");
    fs::write(files.path().join("report.txt"), "quarterly numbers\n").expect("write");
    fs::write(files.path().join("default"), "the default file\n").expect("write");
    let s = Server::builder().set("download", &format!("dir = \"{}\"", files.path().display())).start();
    let guide = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md")).expect("docs/api.md");
    let script = example_script(&guide, &format!("http://{}", s.addr()));
    assert!(script.contains("ADMIN_TOKEN=") && script.contains("jq -er"), "the examples section:\n{script}");
    let work = tempfile::tempdir().expect("tempdir");
    let path = work.path().join("examples.sh");
    fs::write(&path, &script).expect("write script");
    let mut cmd = Command::new("timeout");
    // The service's own variables in this environment would reach `forkd user create`.
    clear_forkd_env(&mut cmd);
    let out = cmd
        .args(["120", "bash"])
        .arg(&path)
        .current_dir(work.path())
        .env("EXAMPLES_BIN", bin())
        .env("EXAMPLES_CONFIG", s.config_path())
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the examples failed ({}):\n--- stderr ---\n{stderr}\n--- stdout ---\n{stdout}",
        out.status
    );
    // What the guide says the steps answer.
    for want in [
        "HTTP/1.1 304",
        "HTTP/1.1 204",
        "\"name\":\"Ada Lovelace\"",
        "event: notification",
        "data: [DONE]",
        "HTTP/1.1 206",
        "{\"status\":\"ok\"}",
    ] {
        assert!(stdout.contains(want), "no {want:?} in what the examples printed:\n{stdout}\n{stderr}");
    }
    assert_eq!(fs::read_to_string(work.path().join("report.txt")).ok().as_deref(), Some("quarterly numbers\n"));
}

//! `--remote` end to end (ignored by default: it cross-builds the tuner).
//! Run by `scripts/test.sh` as
//! `cargo test --workspace --test remote -- --ignored` (`--workspace`, so
//! the features match the workspace test build and nothing is rebuilt).
//! The cross-build uses the `test` profile, whose aarch64 artifacts the
//! NEON and clif suites have already compiled.
//!
//! - the runner transport under qemu-aarch64: build for aarch64, copy, run,
//!   fetch, merge; the record brought back carries the aarch64 fingerprint
//!   (timings under qemu mean nothing; the mechanics are what is checked);
//! - the ssh transport against an sshd started here on loopback with a
//!   throwaway host key and user key, running this host's tuner.
//!
//! A missing tool fails the test under CI and in scripts/test.sh, else it
//! prints SKIP.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use tessera_runtime::record::TuningRecord;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-remote-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn have(tool: &str) -> bool {
    Path::new(tool).is_file()
        || Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// False (SKIP) when a tool is missing; fails naming it under CI
/// (`tessera_dsl::testing`).
fn tools(test: &str, names: &[&str]) -> bool {
    let missing: Vec<&&str> = names.iter().filter(|t| !have(t)).collect();
    if missing.is_empty() {
        return true;
    }
    tessera_dsl::testing::missing_tool(test, &format!("missing {missing:?}"));
    false
}

fn tiny_config() -> PathBuf {
    let cfg = tmp("remote-mini/config.json");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(
        &cfg,
        r#"{"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": 100}"#,
    )
    .unwrap();
    cfg
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
#[ignore = "cross-builds the tuner for aarch64; scripts/test.sh runs it"]
fn runner_transport_tunes_an_aarch64_device_under_qemu() {
    if !tools(
        "runner transport",
        &["qemu-aarch64", "aarch64-linux-gnu-gcc", "cargo"],
    ) {
        return;
    }
    let out = tmp("qemu.json");
    let _ = std::fs::remove_file(&out);
    let o = Command::new(env!("CARGO_BIN_EXE_tessera-autotune"))
        .current_dir(workspace())
        .args([
            "--remote",
            "run:qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu",
        ])
        .args(["--model", tiny_config().to_str().unwrap()])
        .args(["--remote-profile", "test"])
        .args(["--budget", "6", "--threads", "1", "--no-plots", "--quiet"])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    // Done, or partial (qemu is slow): either way a record came back.
    assert!(matches!(o.status.code(), Some(0) | Some(3)), "{stderr}");
    let rec = TuningRecord::load(&out).unwrap();
    assert_eq!(rec.entries.len(), 1);
    let e = &rec.entries[0];
    assert_eq!(e.fingerprint.arch, "aarch64", "{:?}", e.fingerprint);
    assert_eq!(e.model, "remote-mini");
    assert_eq!(e.threads, 1);
}

struct Sshd(Child);

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "starts an sshd on loopback; scripts/test.sh runs it"]
fn ssh_transport_tunes_over_loopback() {
    if !tools(
        "ssh transport",
        &["/usr/sbin/sshd", "ssh", "scp", "ssh-keygen"],
    ) {
        return;
    }
    let dir = tmp("ssh");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let keygen = |name: &str| {
        let ok = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(name))
            .status()
            .unwrap()
            .success();
        assert!(ok, "ssh-keygen {name}");
    };
    keygen("host_key");
    keygen("user_key");
    std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).unwrap();
    let port = 20000 + (std::process::id() % 20000) as u16;
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let cfg = dir.join("sshd_config");
    std::fs::write(
        &cfg,
        format!(
            "ListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
             PermitRootLogin prohibit-password\nPidFile {d}/sshd.pid\nSubsystem sftp internal-sftp\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let _ = std::fs::create_dir_all("/run/sshd");
    let _sshd = Sshd(
        Command::new("/usr/sbin/sshd")
            .arg("-f")
            .arg(&cfg)
            .args(["-D", "-e", "-p", &port.to_string()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Wait for it to listen.
    for _ in 0..50 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = tmp("ssh.json");
    let _ = std::fs::remove_file(&out);
    let bin = env!("CARGO_BIN_EXE_tessera-autotune");
    let o = Command::new(bin)
        .args(["--remote", &format!("ssh://{user}@127.0.0.1:{port}")])
        .args(["--remote-bin", bin])
        .arg("--ssh-option")
        .arg(format!("IdentityFile={}", dir.join("user_key").display()))
        .args(["--ssh-option", "StrictHostKeyChecking=no"])
        .args(["--ssh-option", "UserKnownHostsFile=/dev/null"])
        .args(["--ssh-option", "LogLevel=ERROR"])
        .args(["--model", tiny_config().to_str().unwrap()])
        .args(["--budget", "4", "--no-plots", "--quiet"])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(0) | Some(3)), "{stderr}");
    let rec = TuningRecord::load(&out).unwrap();
    assert_eq!(rec.entries[0].fingerprint.arch, std::env::consts::ARCH);
    assert_eq!(rec.entries[0].model, "remote-mini");

    // A failing step is named, with the command's stderr.
    let o = Command::new(bin)
        .args(["--remote", &format!("ssh://{user}@127.0.0.1:1")])
        .args(["--remote-bin", bin, "--ssh-option", "ConnectTimeout=3"])
        .args(["--budget", "4", "--quiet"])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("remote copy failed") && stderr.contains("ssh"),
        "{stderr}"
    );
}

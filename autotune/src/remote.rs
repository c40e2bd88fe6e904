//! Tuning another device: build the tuner for its target, copy it over,
//! run it there with this run's options, bring the record back and merge
//! it into the local record file.
//!
//! A [`Transport`] moves files and runs commands on the device: `ssh://`
//! (the `ssh`/`scp` binaries), `adb[:SERIAL]` (`adb push`/`shell`/`pull`
//! under `/data/local/tmp`) and `run:COMMAND` (a runner prefix such as
//! `qemu-aarch64 -L /usr/aarch64-linux-gnu`, for a "device" that shares
//! this filesystem). Local commands are argument vectors; the one string a
//! remote shell parses (ssh, adb shell) is built from [`shell_quote`]d
//! words, so no argument can inject shell syntax.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The step of a remote run that failed, for the error message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Build,
    Copy,
    Run,
    Fetch,
    Merge,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Build => "build",
            Step::Copy => "copy",
            Step::Run => "run",
            Step::Fetch => "fetch",
            Step::Merge => "merge",
        })
    }
}

/// A failed step: the command and what it said.
#[derive(Debug, thiserror::Error)]
#[error("remote {step} failed: {what}")]
pub struct RemoteError {
    pub step: Step,
    pub what: String,
}

fn fail(step: Step, what: impl Into<String>) -> RemoteError {
    RemoteError {
        step,
        what: what.into(),
    }
}

/// Run `cmd`; a failure to start or a non-zero exit is `step`'s error,
/// naming the command and quoting its stderr.
pub fn exec(step: Step, cmd: &mut Command) -> Result<Output, RemoteError> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| fail(step, format!("cannot start {shown}: {e}")))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(fail(
            step,
            format!(
                "{shown} exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ))
    }
}

/// Quote one word for a POSIX shell.
pub fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn shell_line(words: &[String]) -> String {
    words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// How files get to the device and commands run on it.
pub trait Transport {
    /// A description for messages.
    fn describe(&self) -> String;
    /// The device's working directory (created).
    fn workdir(&mut self) -> Result<String, RemoteError>;
    /// Copy a local file into `dir` on the device; its path there.
    fn copy(&mut self, local: &Path, dir: &str) -> Result<String, RemoteError>;
    /// Run `program args` on the device in `dir`; its exit code (a non-zero
    /// one is not an error here: the tuner's exit 3 still wrote a record).
    fn run(&mut self, dir: &str, program: &str, args: &[String]) -> Result<Output, RemoteError>;
    /// Bring a device file back to `local`.
    fn fetch(&mut self, remote: &str, local: &Path) -> Result<(), RemoteError>;
}

/// Parse `--remote`: `ssh://user@host[:port]`, `adb[:SERIAL]` or
/// `run:COMMAND`.
pub fn parse(target: &str, ssh_options: &[String]) -> Result<Box<dyn Transport>, String> {
    if let Some(rest) = target.strip_prefix("ssh://") {
        let rest = rest.trim_end_matches('/');
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.contains(']') || h.ends_with(']') => (
                h.to_string(),
                Some(
                    p.parse::<u16>()
                        .map_err(|_| format!("--remote {target}: `{p}` is not a port number"))?,
                ),
            ),
            _ => (rest.to_string(), None),
        };
        if host.is_empty() || host.starts_with('-') {
            return Err(format!(
                "--remote {target}: no host (ssh://user@host[:port])"
            ));
        }
        return Ok(Box::new(Ssh {
            host,
            port,
            options: ssh_options.to_vec(),
        }));
    }
    if target == "adb" || target.starts_with("adb:") {
        let serial = target.strip_prefix("adb:").map(str::to_string);
        if serial
            .as_deref()
            .is_some_and(|s| s.is_empty() || s.starts_with('-'))
        {
            return Err(format!("--remote {target}: bad adb serial"));
        }
        return Ok(Box::new(Adb { serial }));
    }
    if let Some(cmd) = target.strip_prefix("run:") {
        let runner: Vec<String> = cmd.split_whitespace().map(str::to_string).collect();
        return Ok(Box::new(Runner { runner, dir: None }));
    }
    Err(format!(
        "--remote {target}: expected ssh://user@host[:port], adb[:SERIAL] or run:COMMAND"
    ))
}

/// `ssh`/`scp` to `host`.
pub struct Ssh {
    host: String,
    port: Option<u16>,
    /// `-o` options for both (e.g. `IdentityFile=...`).
    options: Vec<String>,
}

impl Ssh {
    fn ssh(&self) -> Command {
        let mut c = Command::new("ssh");
        c.arg("-o").arg("BatchMode=yes");
        for o in &self.options {
            c.arg("-o").arg(o);
        }
        if let Some(p) = self.port {
            c.arg("-p").arg(p.to_string());
        }
        c.arg("--").arg(&self.host);
        c
    }

    fn scp(&self) -> Command {
        let mut c = Command::new("scp");
        c.arg("-q").arg("-o").arg("BatchMode=yes");
        for o in &self.options {
            c.arg("-o").arg(o);
        }
        if let Some(p) = self.port {
            c.arg("-P").arg(p.to_string());
        }
        c
    }
}

impl Transport for Ssh {
    fn describe(&self) -> String {
        format!("ssh {}", self.host)
    }
    fn workdir(&mut self) -> Result<String, RemoteError> {
        let out = exec(
            Step::Copy,
            self.ssh().arg(shell_line(&[
                "mktemp".into(),
                "-d".into(),
                "/tmp/tessera-autotune.XXXXXX".into(),
            ])),
        )?;
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if dir.is_empty() {
            return Err(fail(
                Step::Copy,
                "mktemp -d on the device printed no directory",
            ));
        }
        Ok(dir)
    }
    fn copy(&mut self, local: &Path, dir: &str) -> Result<String, RemoteError> {
        let name = file_name(local)?;
        let remote = format!("{dir}/{name}");
        exec(
            Step::Copy,
            self.scp()
                .arg("--")
                .arg(local)
                .arg(format!("{}:{}", self.host, shell_quote(&remote))),
        )?;
        Ok(remote)
    }
    fn run(&mut self, dir: &str, program: &str, args: &[String]) -> Result<Output, RemoteError> {
        let mut words = vec![program.to_string()];
        words.extend(args.iter().cloned());
        let line = format!(
            "cd {} && chmod +x {} && {}",
            shell_quote(dir),
            shell_quote(program),
            shell_line(&words)
        );
        let shown = format!("ssh {} {line}", self.host);
        self.ssh()
            .arg(line)
            .output()
            .map_err(|e| fail(Step::Run, format!("cannot start {shown}: {e}")))
    }
    fn fetch(&mut self, remote: &str, local: &Path) -> Result<(), RemoteError> {
        exec(
            Step::Fetch,
            self.scp()
                .arg("--")
                .arg(format!("{}:{}", self.host, shell_quote(remote)))
                .arg(local),
        )?;
        Ok(())
    }
}

/// `adb` to a phone (under `/data/local/tmp`, writable and executable for
/// the shell user without root).
pub struct Adb {
    serial: Option<String>,
}

impl Adb {
    fn adb(&self) -> Command {
        let mut c = Command::new("adb");
        if let Some(s) = &self.serial {
            c.arg("-s").arg(s);
        }
        c
    }
}

impl Transport for Adb {
    fn describe(&self) -> String {
        format!(
            "adb {}",
            self.serial.as_deref().unwrap_or("(default device)")
        )
    }
    fn workdir(&mut self) -> Result<String, RemoteError> {
        let dir = "/data/local/tmp/tessera-autotune".to_string();
        exec(
            Step::Copy,
            self.adb()
                .arg("shell")
                .arg(shell_line(&["mkdir".into(), "-p".into(), dir.clone()])),
        )?;
        Ok(dir)
    }
    fn copy(&mut self, local: &Path, dir: &str) -> Result<String, RemoteError> {
        let remote = format!("{dir}/{}", file_name(local)?);
        exec(Step::Copy, self.adb().arg("push").arg(local).arg(&remote))?;
        Ok(remote)
    }
    fn run(&mut self, dir: &str, program: &str, args: &[String]) -> Result<Output, RemoteError> {
        let mut words = vec![program.to_string()];
        words.extend(args.iter().cloned());
        let line = format!(
            "cd {} && chmod 755 {} && {}",
            shell_quote(dir),
            shell_quote(program),
            shell_line(&words)
        );
        self.adb()
            .arg("shell")
            .arg(&line)
            .output()
            .map_err(|e| fail(Step::Run, format!("cannot start adb shell {line}: {e}")))
    }
    fn fetch(&mut self, remote: &str, local: &Path) -> Result<(), RemoteError> {
        exec(Step::Fetch, self.adb().arg("pull").arg(remote).arg(local))?;
        Ok(())
    }
}

/// A runner prefix on this filesystem (`qemu-aarch64 -L ...`, `taskset`,
/// or nothing): copy is a local copy into a temporary directory.
pub struct Runner {
    runner: Vec<String>,
    dir: Option<PathBuf>,
}

impl Transport for Runner {
    fn describe(&self) -> String {
        format!("runner `{}`", self.runner.join(" "))
    }
    fn workdir(&mut self) -> Result<String, RemoteError> {
        let dir = std::env::temp_dir().join(format!(
            "tessera-autotune-remote-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| fail(Step::Copy, format!("cannot create {}: {e}", dir.display())))?;
        self.dir = Some(dir.clone());
        Ok(dir.display().to_string())
    }
    fn copy(&mut self, local: &Path, dir: &str) -> Result<String, RemoteError> {
        let to = Path::new(dir).join(file_name(local)?);
        std::fs::copy(local, &to).map_err(|e| {
            fail(
                Step::Copy,
                format!("cannot copy {} to {}: {e}", local.display(), to.display()),
            )
        })?;
        Ok(to.display().to_string())
    }
    fn run(&mut self, dir: &str, program: &str, args: &[String]) -> Result<Output, RemoteError> {
        let mut cmd = match self.runner.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args).current_dir(dir);
        let shown = format!("{cmd:?}");
        cmd.output()
            .map_err(|e| fail(Step::Run, format!("cannot start {shown}: {e}")))
    }
    fn fetch(&mut self, remote: &str, local: &Path) -> Result<(), RemoteError> {
        std::fs::copy(remote, local)
            .map(|_| ())
            .map_err(|e| fail(Step::Fetch, format!("cannot read {remote}: {e}")))
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn file_name(p: &Path) -> Result<String, RemoteError> {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| fail(Step::Copy, format!("{} has no file name", p.display())))
}

/// Cross-build the tuner for `triple` with cargo's `profile` and return the
/// binary's path, from cargo's own artifact messages. `--workspace` (only
/// the tuner's binary is built): the workspace's features, so a checkout
/// that has built its tests for `triple` reuses those artifacts.
pub fn build(triple: &str, profile: &str) -> Result<PathBuf, RemoteError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = exec(
        Step::Build,
        Command::new(cargo).args([
            "build",
            "--profile",
            profile,
            "--workspace",
            "--bin",
            "tessera-autotune",
            "--target",
            triple,
            "--message-format=json",
        ]),
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "tessera-autotune")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| fail(Step::Build, "cargo built no tessera-autotune executable"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_leaves_no_shell_syntax() {
        assert_eq!(shell_quote("--budget"), "--budget");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("x'; rm -rf /"), r"'x'\''; rm -rf /'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$(id)"), "'$(id)'");
    }

    #[test]
    fn targets_parse_or_say_what_is_expected() {
        assert_eq!(
            parse("ssh://pi@board:2222", &[]).unwrap().describe(),
            "ssh pi@board"
        );
        assert_eq!(
            parse("ssh://pi@board", &[]).unwrap().describe(),
            "ssh pi@board"
        );
        assert!(parse("ssh://pi@board:x", &[]).is_err());
        assert!(parse("ssh://-oProxyCommand=x", &[]).is_err());
        assert_eq!(
            parse("adb", &[]).unwrap().describe(),
            "adb (default device)"
        );
        assert_eq!(parse("adb:R58M", &[]).unwrap().describe(), "adb R58M");
        assert!(parse("adb:-x", &[]).is_err());
        assert_eq!(
            parse("run:qemu-aarch64 -L /usr/x", &[]).unwrap().describe(),
            "runner `qemu-aarch64 -L /usr/x`"
        );
        let e = parse("ftp://x", &[]).err().unwrap();
        assert!(
            e.contains("ssh://") && e.contains("adb") && e.contains("run:"),
            "{e}"
        );
    }

    #[test]
    fn the_runner_copies_runs_and_fetches_locally() {
        let mut t = parse("run:", &[]).unwrap();
        let dir = t.workdir().unwrap();
        let src = std::env::temp_dir().join(format!("tessera-remote-unit-{}", std::process::id()));
        std::fs::write(&src, "hello").unwrap();
        let there = t.copy(&src, &dir).unwrap();
        assert!(there.starts_with(&dir));
        let out = t.run(&dir, "cat", std::slice::from_ref(&there)).unwrap();
        assert_eq!(out.stdout, b"hello");
        let back = src.with_extension("back");
        t.fetch(&there, &back).unwrap();
        assert_eq!(std::fs::read_to_string(&back).unwrap(), "hello");
        let e = t.fetch("/nonexistent/x", &back).unwrap_err();
        assert_eq!(e.step, Step::Fetch);
        let e = exec(Step::Run, &mut Command::new("false")).unwrap_err();
        assert!(e.to_string().starts_with("remote run failed"), "{e}");
        let _ = std::fs::remove_file(&src);
        let _ = std::fs::remove_file(&back);
    }
}

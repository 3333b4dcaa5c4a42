//! Approvals of exec commands through the real exec component in the real engine, decided by the
//! real broker: an allowlist that wrappers, nested shells, substitutions and multicall forms
//! cannot get around (each bypass must leave the victim file in place), a plan approved by an
//! operator that binds what runs (a script changed after approval is refused), a timeout that
//! denies, and a denial the model reads.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clawcage_agent::ToolRegistry;
use clawcage_agent::approvals::{ApprovalBroker, ApprovalSettings, OperatorEvent, OperatorFilter};
use clawcage_core::approval::{AllowEntry, ApprovalDecision, AskMode, ExecMode};
use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{ExecGrant, FsMode, Limits};
use serde_json::json;

fn settings(mode: ExecMode, ask: AskMode, allow: &[&str]) -> ApprovalSettings {
    let mut settings = ApprovalSettings::default();
    settings.exec.mode = mode;
    settings.ask = ask;
    settings.exec.allow = allow
        .iter()
        .map(|entry| AllowEntry::parse(entry).unwrap())
        .collect();
    settings
}

async fn registry(workspace: &Path, broker: &ApprovalBroker) -> ToolRegistry {
    let grants = clawcage_tests::grants(workspace, FsMode::ReadWrite, Limits::default()).with_exec(
        ExecGrant::new(clawcage_tests::programs().await).with_approvals(Arc::new(broker.clone())),
    );
    clawcage_tests::registry_of(&[("exec", bundled::EXEC)], grants).await
}

async fn run(registry: &ToolRegistry, command: &str) -> String {
    match registry
        .execute_value("exec", &json!({ "command": command }))
        .await
    {
        Ok(output) => output.text,
        Err(error) => format!("ERROR {}: {}", error.kind(), error.message()),
    }
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("victim.txt"), "keep me\n").unwrap();
    fs::write(dir.path().join("list.txt"), "victim.txt\n").unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allowlist_runs_what_it_covers_and_refuses_the_rest_before_anything_runs() {
    let dir = workspace();
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::Off, &["ls *", "cat *"]),
        None,
        None,
    );
    let registry = registry(dir.path(), &broker).await;
    let listed = run(&registry, "ls").await;
    assert!(listed.contains("victim.txt"), "{listed}");
    // Safe bins pass while they read standard input only; builtins need no entry.
    let counted = run(&registry, "cat list.txt | wc -l && echo done").await;
    assert!(
        counted.contains('1') && counted.contains("done"),
        "{counted}"
    );
    // One command outside the list refuses the whole line: `ls` before it does not run either.
    let refused = run(&registry, "ls > listing.txt; rm victim.txt").await;
    assert!(refused.starts_with("ERROR denied"), "{refused}");
    assert!(
        refused.contains("`rm victim.txt` is not on the allowlist"),
        "{refused}"
    );
    assert!(
        !dir.path().join("listing.txt").exists(),
        "ls ran before the decision"
    );
    // A safe bin naming a file is not safe.
    let named = run(&registry, "head victim.txt").await;
    assert!(named.starts_with("ERROR denied"), "{named}");
    assert!(dir.path().join("victim.txt").exists());
}

/// An entry's word covers one argument inside what it names: `rm -r build/*` removes what is
/// under `build` and nothing more, however the extra is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlist_entry_for_one_directory_removes_nothing_beside_it() {
    let dir = workspace();
    for name in ["a", "b"] {
        fs::create_dir_all(dir.path().join("build").join(name)).unwrap();
    }
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::Off, &["rm -r build/*"]),
        None,
        None,
    );
    let registry = registry(dir.path(), &broker).await;
    for bypass in [
        "rm -r build/a victim.txt",
        "rm -r build/a 'victim.txt'",
        "rm -r build/../victim.txt",
        "rm -r build/a/../../victim.txt",
        "rm -r build/a build/b",
    ] {
        let refused = run(&registry, bypass).await;
        assert!(refused.starts_with("ERROR denied"), "{bypass}: {refused}");
        assert!(dir.path().join("victim.txt").exists(), "{bypass}");
        assert!(dir.path().join("build").join("a").exists(), "{bypass}");
    }
    let removed = run(&registry, "rm -r build/a").await;
    assert!(!removed.starts_with("ERROR"), "{removed}");
    assert!(!dir.path().join("build").join("a").exists());
    assert!(dir.path().join("build").join("b").exists());
    assert!(dir.path().join("victim.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrappers_shells_and_other_names_do_not_get_around_the_allowlist() {
    let dir = workspace();
    // Entries that a bypass would try to ride on: `ls`, `cat`, `find` with any arguments, and
    // `timeout`/`nice`/`env` themselves.
    let broker = ApprovalBroker::new(
        settings(
            ExecMode::Allowlist,
            AskMode::Off,
            &[
                "ls *",
                "cat *",
                "find *",
                "timeout *",
                "nice *",
                "nohup *",
                "env *",
                "xargs *",
            ],
        ),
        None,
        None,
    );
    let registry = registry(dir.path(), &broker).await;
    // A copy of nothing under the name of an allowed program: `./ls` is still the real `ls`.
    fs::write(dir.path().join("ls"), "rm victim.txt\n").unwrap();
    for bypass in [
        "env bash -c 'rm victim.txt'",
        "env rm victim.txt",
        "sh -c 'rm victim.txt'",
        "bash -c \"rm victim.txt\"",
        "sh -c 'sh -c \"rm victim.txt\"'",
        "eval rm victim.txt",
        "echo $(rm victim.txt)",
        "echo `rm victim.txt`",
        "X=$(rm victim.txt) true",
        "cat list.txt | xargs rm",
        "xargs rm < list.txt",
        "find . -name victim.txt -exec rm {} ;",
        "timeout 5 rm victim.txt",
        "nice -n 5 rm victim.txt",
        "nohup rm victim.txt",
        "coreutils rm victim.txt",
        "/bin/rm victim.txt",
        "/usr/bin/coreutils rm victim.txt",
        "./rm victim.txt",
        "f() { rm victim.txt; }; f",
        "alias ls=rm; ls victim.txt",
        "command rm victim.txt",
        "builtin rm victim.txt",
        "exec rm victim.txt",
        "sh <<EOF\nrm victim.txt\nEOF",
        "sh ls",
        "C=rm; $C victim.txt",
        "for p in rm; do $p victim.txt; done",
        "mv victim.txt gone.txt",
    ] {
        let result = run(&registry, bypass).await;
        assert!(
            dir.path().join("victim.txt").exists(),
            "`{bypass}` removed the victim: {result}"
        );
        assert!(
            !dir.path().join("gone.txt").exists(),
            "`{bypass}`: {result}"
        );
    }
    // `find -exec` is refused as such, naming why.
    let result = run(&registry, "find . -name victim.txt -exec rm {} ;").await;
    assert!(result.contains("find -exec"), "{result}");
    // `nice` (a program here) is taken off: what is judged is the `rm` it would run.
    let result = run(&registry, "nice -n 5 rm victim.txt").await;
    assert!(
        result.contains("`rm victim.txt` is not on the allowlist"),
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_binds_the_plan_a_changed_script_is_refused() {
    let dir = workspace();
    fs::write(dir.path().join("run.sh"), "ls\n").unwrap();
    fs::write(dir.path().join("evil.sh"), "rm victim.txt\n").unwrap();
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::OnMiss, &[]),
        None,
        None,
    );
    let registry = registry(dir.path(), &broker).await;
    let mut operator = broker.operator(OperatorFilter::All);
    // The operator sees `cp evil.sh run.sh` and the script's `ls`, and approves that.
    let approver = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(event) = operator.next().await {
            if let OperatorEvent::Requested(request) = event {
                seen.push(request.plan.summary());
                operator
                    .resolve(&request.id, ApprovalDecision::AllowOnce, "test")
                    .unwrap();
                return seen;
            }
        }
        seen
    });
    let result = run(&registry, "cp evil.sh run.sh && sh run.sh").await;
    let seen = approver.await.unwrap();
    assert_eq!(seen, ["cp evil.sh run.sh\nls"]);
    // What runs after the copy is `rm`, which nobody approved.
    assert!(
        result.contains("not part of the command that was approved"),
        "{result}"
    );
    assert!(dir.path().join("victim.txt").exists(), "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_request_is_denied_at_its_timeout_and_a_denial_is_the_models_result() {
    let dir = workspace();
    let mut config = settings(ExecMode::Allowlist, AskMode::OnMiss, &[]);
    config.timeout = Duration::from_millis(300);
    let broker = ApprovalBroker::new(config, None, None);
    let registry = registry(dir.path(), &broker).await;
    // Connected but silent.
    let mut operator = broker.operator(OperatorFilter::All);
    let result = run(&registry, "rm victim.txt").await;
    assert!(result.starts_with("ERROR denied"), "{result}");
    assert!(result.contains("nobody approved"), "{result}");
    assert!(dir.path().join("victim.txt").exists());
    assert!(matches!(
        operator.next().await,
        Some(OperatorEvent::Requested(_))
    ));
    assert!(matches!(
        operator.next().await,
        Some(OperatorEvent::Resolved { by, .. }) if by == "timeout"
    ));

    // Answered with deny: the model reads that the operator refused.
    let answering = tokio::spawn(async move {
        while let Some(event) = operator.next().await {
            if let OperatorEvent::Requested(request) = event {
                operator
                    .resolve(&request.id, ApprovalDecision::Deny, "test")
                    .unwrap();
                break;
            }
        }
    });
    let result = run(&registry, "rm victim.txt").await;
    answering.await.unwrap();
    assert!(result.contains("denied by the operator"), "{result}");
    assert!(dir.path().join("victim.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_deny_refuses_every_command_and_full_asks_nothing() {
    let dir = workspace();
    let deny = ApprovalBroker::new(settings(ExecMode::Deny, AskMode::Off, &[]), None, None);
    let registry = registry(dir.path(), &deny).await;
    let result = run(&registry, "ls").await;
    assert!(result.contains("exec = \"deny\""), "{result}");
    let full = ApprovalBroker::new(ApprovalSettings::default(), None, None);
    let registry = self::registry(dir.path(), &full).await;
    assert!(
        run(&registry, "rm victim.txt && echo gone")
            .await
            .contains("gone")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_off_the_allow_list_is_asked_and_an_approval_allows_exactly_that_host() {
    use clawcage_agent::approvals::ApprovalStore;
    use clawcage_sandbox::{AllowList, Grants, NetworkPolicy};
    use clawcage_tests::web::{Reply, TestResolver, WebServer};

    let server = WebServer::start(|_| Reply::html("<p>reached</p>"));
    let resolver = TestResolver::new()
        .map("docs.test", &["127.0.0.1"])
        .map("other.test", &["127.0.0.1"]);
    let state = tempfile::tempdir().unwrap();
    let config = ApprovalSettings {
        network_ask: true,
        ..ApprovalSettings::default()
    };
    let broker = ApprovalBroker::new(
        config,
        Some(ApprovalStore::in_state_dir(state.path())),
        None,
    );
    let policy = NetworkPolicy::new(AllowList::parse(["allowed.test"]).unwrap())
        .with_resolver(resolver)
        .with_approvals(Arc::new(broker.clone()));
    let registry = clawcage_tests::registry_of(
        &[("web", bundled::WEB)],
        Grants::none().with_network(policy),
    )
    .await;
    let port = server.port();
    let fetch = |host: &str| {
        let registry = registry.clone();
        let url = format!("http://{host}:{port}/x");
        async move {
            match registry
                .execute_value("web_fetch", &json!({ "url": url }))
                .await
            {
                Ok(output) => output.text,
                Err(error) => format!("ERROR {}: {}", error.kind(), error.message()),
            }
        }
    };

    // Nobody to ask: refused, and nothing reached the server.
    let refused = fetch("docs.test").await;
    assert!(refused.contains("no operator is connected"), "{refused}");
    assert!(server.requests().is_empty());

    let answers = clawcage_tests::answer_in_order(
        &broker,
        vec![
            ApprovalDecision::AllowOnce,
            ApprovalDecision::Deny,
            ApprovalDecision::AllowAlways,
        ],
    );
    assert!(fetch("docs.test").await.ends_with("reached"));
    let denied = fetch("docs.test").await;
    assert!(denied.contains("denied by the operator"), "{denied}");
    assert!(fetch("docs.test").await.ends_with("reached"));
    let asked = answers.await.unwrap();
    let entry = format!("http://docs.test:{port}");
    assert_eq!(asked, vec![("network".to_string(), entry.clone()); 3]);
    // Kept: asked no more (the operator is gone, so a question would be refused).
    assert!(fetch("docs.test").await.ends_with("reached"));
    let kept = ApprovalStore::in_state_dir(state.path()).list().unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].kind, "network");
    assert_eq!(kept[0].entry.program, entry);
    assert_eq!(kept[0].rule(), entry, "listed as the host entry alone");
    // Exactly that host: another one is still refused.
    let other = fetch("other.test").await;
    assert!(other.contains("other.test"), "{other}");
    assert!(other.starts_with("ERROR"), "{other}");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_about_a_host_does_not_use_up_the_calls_time() {
    use clawcage_sandbox::{AllowList, Grants, NetworkPolicy};
    use clawcage_tests::web::{Reply, TestResolver, WebServer};

    let server = WebServer::start(|_| Reply::html("<p>reached</p>"));
    let broker = ApprovalBroker::new(
        ApprovalSettings {
            network_ask: true,
            ..ApprovalSettings::default()
        },
        None,
        None,
    );
    let policy = NetworkPolicy::new(AllowList::parse(["allowed.test"]).unwrap())
        .with_resolver(TestResolver::new().map("docs.test", &["127.0.0.1"]))
        .with_approvals(Arc::new(broker.clone()));
    // The call may run 1 s; the person takes 1.5 s to say yes.
    let limits = Limits {
        timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let registry = clawcage_tests::registry_of(
        &[("web", bundled::WEB)],
        Grants::none().with_network(policy).with_limits(limits),
    )
    .await;
    let mut operator = broker.operator(OperatorFilter::All);
    let answering = tokio::spawn(async move {
        while let Some(event) = operator.next().await {
            if let OperatorEvent::Requested(request) = event {
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                operator
                    .resolve(&request.id, ApprovalDecision::AllowOnce, "test")
                    .unwrap();
                return;
            }
        }
    });
    let url = format!("http://docs.test:{}/x", server.port());
    let fetched = registry
        .execute_value("web_fetch", &json!({ "url": url }))
        .await
        .map(|output| output.text)
        .unwrap_or_else(|error| format!("ERROR {error}"));
    answering.await.unwrap();
    assert!(fetched.ends_with("reached"), "{fetched}");
}

/// A file whose content and modification time a refused write must leave as they were.
struct Kept {
    path: std::path::PathBuf,
    text: &'static str,
    modified: std::time::SystemTime,
}

impl Kept {
    fn new(dir: &Path, name: &str, text: &'static str) -> Kept {
        let path = dir.join(name);
        fs::write(&path, text).unwrap();
        let modified = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(modified)
            .unwrap();
        Kept {
            path,
            text,
            modified,
        }
    }

    fn assert_unchanged(&self, command: &str, result: &str) {
        assert_eq!(
            fs::read_to_string(&self.path).unwrap(),
            self.text,
            "`{command}` changed {}: {result}",
            self.path.display()
        );
        assert_eq!(
            fs::metadata(&self.path).unwrap().modified().unwrap(),
            self.modified,
            "`{command}` touched {}: {result}",
            self.path.display()
        );
    }
}

/// The reason a write by redirection is refused under an allowlist, naming the redirection.
fn write_refused(redirection: &str) -> String {
    format!("`{redirection}` writes a file, and writes by redirection are not on the allowlist")
}

/// An allowlist entry allows running a program, never writing a file through the shell: every
/// redirection that writes is refused before anything runs, for the write and in its own words,
/// while reading by redirection stays allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlist_refuses_every_write_by_redirection_and_names_it() {
    let dir = workspace();
    let notes = Kept::new(dir.path(), "notes.txt", "b\na\n");
    let a = Kept::new(dir.path(), "a", "line a\n");
    let only_ls = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::Off, &["ls *"]),
        None,
        None,
    );
    let registry = registry(dir.path(), &only_ls).await;
    for (command, redirection) in [
        ("sort < notes.txt > copy.txt", "> copy.txt"),
        ("head -n 1 < a > notes.txt", "> notes.txt"),
        ("echo x > f", "> f"),
        ("ls > listing.txt", "> listing.txt"),
    ] {
        let result = run(&registry, command).await;
        assert!(result.starts_with("ERROR denied"), "{command}: {result}");
        assert!(
            result.contains(&write_refused(redirection)),
            "{command}: {result}"
        );
        // The reason is the write, never a program the shell would use for it.
        assert!(!result.contains("`cat"), "{command}: {result}");
        assert!(!result.contains("`sort"), "{command}: {result}");
        notes.assert_unchanged(command, &result);
        a.assert_unchanged(command, &result);
        for created in ["copy.txt", "f", "listing.txt"] {
            assert!(!dir.path().join(created).exists(), "{command}: {result}");
        }
    }
    // `sort -o` is still refused as the option that writes it is.
    let result = run(&registry, "sort -o copy.txt notes.txt").await;
    assert!(result.starts_with("ERROR denied"), "{result}");
    assert!(!dir.path().join("copy.txt").exists());
    // Reading by redirection is a read: the safe bin passes, and `ls` still runs.
    let sorted = run(&registry, "sort < notes.txt").await;
    assert!(sorted.contains("a\nb"), "{sorted}");
    let first = run(&registry, "head -n 1 < a").await;
    assert!(first.contains("line a"), "{first}");
    assert!(run(&registry, "ls").await.contains("notes.txt"));
    // Copies of descriptors and /dev/null write no file.
    let quiet = run(
        &registry,
        "ls 2>&1 && ls > /dev/null 2>/dev/null && echo done",
    )
    .await;
    assert!(quiet.contains("done"), "{quiet}");
    notes.assert_unchanged("sort < notes.txt", &sorted);

    // With `cat *` allowed: its writes through the shell are refused all the same, however they
    // are written.
    let with_cat = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::Off, &["cat *", "ls *"]),
        None,
        None,
    );
    let registry = self::registry(dir.path(), &with_cat).await;
    for (command, redirection) in [
        (": > notes.txt", "> notes.txt"),
        ("echo x > notes.txt", "> notes.txt"),
        ("cat a > notes.txt", "> notes.txt"),
        ("> notes.txt", "> notes.txt"),
        ("cat a >> notes.txt", ">> notes.txt"),
        ("cat a >| notes.txt", ">| notes.txt"),
        ("cat a 1<> notes.txt", "1<> notes.txt"),
        ("cat a &> notes.txt", "&> notes.txt"),
        ("cat a >& notes.txt", ">& notes.txt"),
        ("cat nothing 2> notes.txt", "2> notes.txt"),
        ("cat <<EOF > notes.txt\nx\nEOF", "> notes.txt"),
        ("echo x | cat > notes.txt", "> notes.txt"),
        ("{ cat a; echo x; } > notes.txt", "> notes.txt"),
        ("for i in 1; do echo $i; done > notes.txt", "> notes.txt"),
        ("sh -c 'cat a > notes.txt'", "> notes.txt"),
        ("echo $(echo x > notes.txt)", "> notes.txt"),
        ("ls; cat a > notes.txt", "> notes.txt"),
    ] {
        let result = run(&registry, command).await;
        assert!(result.starts_with("ERROR denied"), "{command}: {result}");
        assert!(
            result.contains(&write_refused(redirection)),
            "{command}: {result}"
        );
        assert!(
            !result.contains("is not on the allowlist;") && !result.contains("`cat` is not"),
            "{command}: {result}"
        );
        notes.assert_unchanged(command, &result);
        a.assert_unchanged(command, &result);
    }
    let shown = run(&registry, "cat a").await;
    assert!(shown.contains("line a"), "{shown}");
}

/// Asked on a miss, a write by redirection is shown to the operator as a write; an approval lets
/// exactly that write happen, a denial leaves the file as it was, and under `full` nothing is
/// asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_by_redirection_is_asked_and_the_answer_decides_it() {
    let dir = workspace();
    let notes = Kept::new(dir.path(), "notes.txt", "b\na\n");
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::OnMiss, &["ls *"]),
        None,
        None,
    );
    let registry = registry(dir.path(), &broker).await;
    let mut operator = broker.operator(OperatorFilter::All);
    let approver = tokio::spawn(async move {
        let mut seen = Vec::new();
        for decision in [ApprovalDecision::Deny, ApprovalDecision::AllowOnce] {
            while let Some(event) = operator.next().await {
                if let OperatorEvent::Requested(request) = event {
                    seen.push((request.plan.summary(), request.reasons.clone()));
                    operator.resolve(&request.id, decision, "test").unwrap();
                    break;
                }
            }
        }
        seen
    });
    let denied = run(&registry, "echo x > notes.txt").await;
    assert!(denied.contains("denied by the operator"), "{denied}");
    notes.assert_unchanged("echo x > notes.txt", &denied);
    let copied = run(&registry, "sort < notes.txt > copy.txt").await;
    assert!(!copied.starts_with("ERROR"), "{copied}");
    assert_eq!(
        fs::read_to_string(dir.path().join("copy.txt")).unwrap(),
        "a\nb\n"
    );
    notes.assert_unchanged("sort < notes.txt > copy.txt", &copied);
    let seen = approver.await.unwrap();
    assert_eq!(
        seen,
        [
            (
                "writes a file: > notes.txt".to_string(),
                vec![write_refused("> notes.txt")]
            ),
            (
                "sort < notes.txt > copy.txt\nwrites a file: > copy.txt".to_string(),
                vec![write_refused("> copy.txt")]
            ),
        ]
    );

    // Under `full` a redirection writes without a question, builtins' output included.
    let full = ApprovalBroker::new(ApprovalSettings::default(), None, None);
    let registry = self::registry(dir.path(), &full).await;
    let written = run(&registry, "echo x > f && : > empty && cat notes.txt > g").await;
    assert!(!written.starts_with("ERROR"), "{written}");
    assert_eq!(fs::read_to_string(dir.path().join("f")).unwrap(), "x\n");
    assert_eq!(fs::read_to_string(dir.path().join("empty")).unwrap(), "");
    assert_eq!(fs::read_to_string(dir.path().join("g")).unwrap(), "b\na\n");
}

/// The plan is what the operator sees, not what enforces the decision: a write the plan did not
/// show — a script rewritten after the plan, a script built at run time — is refused by the host
/// before the file is opened, even when every program it runs is allowed, and an approved write
/// allows only the file it named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_refuses_a_write_by_redirection_the_plan_did_not_show() {
    let dir = workspace();
    let notes = Kept::new(dir.path(), "notes.txt", "keep\n");
    fs::write(dir.path().join("a"), "line a\n").unwrap();
    fs::write(dir.path().join("run.sh"), "ls\n").unwrap();
    fs::write(
        dir.path().join("evil.sh"),
        "cat a > notes.txt\necho pwned >> notes.txt\n: > notes.txt\n",
    )
    .unwrap();
    let broker = ApprovalBroker::new(
        settings(ExecMode::Allowlist, AskMode::OnMiss, &["ls *", "cat *"]),
        None,
        None,
    );
    let registry = registry(dir.path(), &broker).await;
    let answers = clawcage_tests::answer_in_order(&broker, vec![ApprovalDecision::AllowOnce; 3]);

    // The operator approves `cp evil.sh run.sh` and the script's `ls`; what runs after the copy
    // writes notes.txt three ways, none of which was approved.
    let result = run(&registry, "cp evil.sh run.sh && sh run.sh").await;
    assert!(
        result.contains("writes by redirection are not on the allowlist"),
        "{result}"
    );
    assert!(
        result.contains("is not part of the command that was approved"),
        "{result}"
    );
    assert!(!result.contains("`cat"), "{result}");
    notes.assert_unchanged("sh run.sh (rewritten)", &result);

    // A script known only at run time: the operator approves `sh -c "$S"` as shown; the write
    // inside it was never shown, so it is refused, with `cat` allowed and the builtins too.
    for script in ["cat a > notes.txt", "echo pwned > notes.txt"] {
        let command = format!("S='{script}'; sh -c \"$S\"");
        let result = run(&registry, &command).await;
        assert!(
            result.contains("writes by redirection are not on the allowlist"),
            "{command}: {result}"
        );
        notes.assert_unchanged(&command, &result);
    }
    let asked = answers.await.unwrap();
    assert_eq!(asked.len(), 3, "{asked:?}");

    // An approved write allows the file it named, and no other.
    let answers = clawcage_tests::answer_in_order(&broker, vec![ApprovalDecision::AllowOnce]);
    let command = "echo ok > copy.txt; S='echo pwned > notes.txt'; sh -c \"$S\"";
    let result = run(&registry, command).await;
    answers.await.unwrap();
    assert_eq!(
        fs::read_to_string(dir.path().join("copy.txt")).unwrap(),
        "ok\n"
    );
    assert!(
        result.contains("writes by redirection are not on the allowlist"),
        "{result}"
    );
    notes.assert_unchanged(command, &result);
}

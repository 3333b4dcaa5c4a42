//! The rules, unit-tested without a runtime.

use super::*;

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|word| word.to_string()).collect()
}

fn allowlist(entries: &[&str]) -> ExecPolicy {
    ExecPolicy {
        mode: ExecMode::Allowlist,
        allow: entries
            .iter()
            .map(|entry| AllowEntry::parse(entry).expect("entry"))
            .collect(),
        safe_bins: strings(DEFAULT_SAFE_BINS),
    }
}

#[test]
fn planned_arguments_match_like_a_glob_over_words_and_stay_fast() {
    let arg = |matches: ArgMatch| PlannedArg {
        written: String::new(),
        matches,
    };
    let exact = |text: &str| arg(ArgMatch::Exact(text.to_string()));
    let words = |list: &[&str]| strings(list);
    let plan = [exact("-r"), arg(ArgMatch::Any), exact("end")];
    assert!(args_match(&plan, &words(&["-r", "end"])));
    assert!(args_match(&plan, &words(&["-r", "a", "b", "end"])));
    assert!(!args_match(&plan, &words(&["-r", "a", "b"])));
    assert!(!args_match(&plan, &words(&["-x", "end"])));
    let plan = [arg(ArgMatch::Glob("*.txt".into())), arg(ArgMatch::Any)];
    assert!(args_match(&plan, &words(&["a.txt"])));
    assert!(args_match(&plan, &words(&["a.txt", "b", "c"])));
    assert!(!args_match(&plan, &words(&[])));
    assert!(args_match(&[arg(ArgMatch::Any)], &words(&[])));
    assert!(args_match(&[], &words(&[])));
    assert!(!args_match(&[], &words(&["x"])));
    // A plan of many unquoted expansions against a long command that does not fit: the
    // backtracking form took C(n+k, k) steps (about 10^17 here); this one stays quick.
    let mut plan: Vec<PlannedArg> = (0..30).map(|_| arg(ArgMatch::Any)).collect();
    plan.push(exact("z"));
    let actual: Vec<String> = (0..60).map(|_| "a".to_string()).collect();
    let started = std::time::Instant::now();
    assert!(!args_match(&plan, &actual));
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
}

#[test]
fn globs_match_any_text_and_escape_their_metacharacters() {
    assert!(glob_match("-r build/*", "-r build/a b"));
    assert!(!glob_match("-r build/*", "-r /etc"));
    assert!(glob_match("a?c", "abc"));
    assert!(glob_match("\\*", "*"));
    assert!(!glob_match("\\*", "x"));
    assert!(glob_match(&glob_escape("a*b?"), "a*b?"));
    assert!(!glob_match(&glob_escape("a*b?"), "aXXbY"));
    assert!(glob_match("", ""));
    assert!(!glob_match("", "x"));
    // A pathological pattern stays fast.
    let text = "a".repeat(10_000);
    assert!(!glob_match(&format!("{}b", "*a".repeat(50)), &text));
}

#[test]
fn wrappers_are_taken_off_down_to_the_program_that_runs() {
    let unwrap = |words: &[&str]| {
        let words = strings(words);
        unwrap_program(&words[0], &words[1..])
    };
    for line in [
        &["timeout", "5", "rm", "-rf", "x"][..],
        &["timeout", "-s", "KILL", "5", "rm", "-rf", "x"],
        &["nice", "-n", "10", "rm", "-rf", "x"],
        &["nohup", "rm", "-rf", "x"],
        &["env", "A=1", "B=2", "rm", "-rf", "x"],
        &["env", "-i", "rm", "-rf", "x"],
        &["stdbuf", "-o", "L", "rm", "-rf", "x"],
        &["coreutils", "rm", "-rf", "x"],
        &["/usr/bin/coreutils", "rm", "-rf", "x"],
        &["command", "rm", "-rf", "x"],
        &["builtin", "rm", "-rf", "x"],
        &["timeout", "5", "nice", "coreutils", "/bin/rm", "-rf", "x"],
        &["./rm", "-rf", "x"],
    ] {
        let effective = unwrap(line);
        assert_eq!(effective.program, "rm", "{line:?}");
        assert_eq!(effective.args, strings(&["-rf", "x"]), "{line:?}");
        assert!(effective.opaque.is_none());
    }
    for line in [
        &["xargs", "rm"][..],
        &["find", ".", "-exec", "rm", "{}", ";"],
        &["find", ".", "-execdir", "rm", "{}", "+"],
        &["sh", "-c", "rm -rf x"],
        &["bash", "-c", "rm -rf x"],
        &["env", "bash", "-c", "rm -rf x"],
        &["eval", "rm -rf x"],
        &["env", "-S", "rm -rf x"],
        &["timeout", "5", "sh", "-c", "rm"],
    ] {
        assert!(unwrap(line).opaque.is_some(), "{line:?}");
    }
}

#[test]
fn an_allowlist_covers_its_programs_and_nothing_wrapped_around_others() {
    let policy = allowlist(&["ls", "rm -r build/*", "grep *"]);
    let covers = |words: &[&str]| {
        let words = strings(words);
        policy.covers(&words[0], &words[1..])
    };
    assert_eq!(covers(&["ls", "-la"]), Coverage::Allowlisted);
    assert_eq!(covers(&["rm", "-r", "build/x"]), Coverage::Allowlisted);
    assert_eq!(
        covers(&["timeout", "3", "rm", "-r", "build/x"]),
        Coverage::Allowlisted
    );
    assert!(matches!(covers(&["rm", "-r", "src"]), Coverage::Miss(_)));
    assert!(matches!(
        covers(&["timeout", "3", "rm", "-r", "src"]),
        Coverage::Miss(_)
    ));
    assert!(matches!(
        covers(&["coreutils", "rm", "-r", "src"]),
        Coverage::Miss(_)
    ));
    assert!(matches!(covers(&["xargs", "ls"]), Coverage::Miss(_)));
    assert!(matches!(
        covers(&["find", ".", "-exec", "ls", ";"]),
        Coverage::Miss(_)
    ));
    assert!(matches!(
        covers(&["env", "sh", "-c", "ls"]),
        Coverage::Miss(_)
    ));
    assert!(matches!(covers(&["cat", "x"]), Coverage::Miss(_)));
}

#[test]
fn an_allowlist_word_covers_one_argument_and_never_climbs_out() {
    let policy = allowlist(&[
        "rm -r build/*",
        "ls *",
        "git status *",
        r"cp a\ b.txt dest/",
        "tar -cf out.tar *",
        "make --directory=*",
    ]);
    let covers = |words: &[&str]| {
        let words = strings(words);
        policy.covers(&words[0], &words[1..])
    };
    for allowed in [
        &["rm", "-r", "build/x"][..],
        &["rm", "-r", "build/a b"],
        &["rm", "-r", "build/a/b"],
        &["ls"],
        &["ls", "-la", "a", "b"],
        &["git", "status"],
        &["git", "status", "--short"],
        &["cp", "a b.txt", "dest/"],
        &["tar", "-cf", "out.tar", "x", "y"],
        &["make", "--directory=sub"],
    ] {
        assert_eq!(covers(allowed), Coverage::Allowlisted, "{allowed:?}");
    }
    for refused in [
        // One word is one argument: `build/*` does not run on into a second one.
        &["rm", "-r", "build/x", "victim.txt"][..],
        &["rm", "-r", "build/x", "build/y"],
        &["rm", "-r"],
        // Nor does it climb out of the directory it names.
        &["rm", "-r", "build/../src"],
        &["rm", "-r", "build/a/../../src"],
        &["rm", "-r", "build/.."],
        &["make", "--directory=../elsewhere"],
        &["cp", "a", "b.txt", "dest/"],
        &["git", "stash"],
    ] {
        assert!(matches!(covers(refused), Coverage::Miss(_)), "{refused:?}");
    }
    // An entry kept from an approved plan: an argument with a space stays one word, and a
    // quoted expansion's glob stays one argument.
    let command = PlannedCommand {
        program: Some("rm".into()),
        written: "rm".into(),
        args: vec![
            PlannedArg {
                written: "'my file.txt'".into(),
                matches: ArgMatch::Exact("my file.txt".into()),
            },
            PlannedArg {
                written: "\"out $N\"".into(),
                matches: ArgMatch::Glob("out *".into()),
            },
        ],
        redirections: Vec::new(),
    };
    let entry = AllowEntry::exactly(&command).expect("named program");
    assert_eq!(entry.to_string(), r"rm my\ file.txt out\ *");
    let kept = AllowEntry::parse(&entry.to_string()).expect("parses back");
    assert!(kept.allows("rm", &strings(&["my file.txt", "out 3"])));
    assert!(!kept.allows("rm", &strings(&["my", "file.txt", "out 3"])));
    assert!(!kept.allows("rm", &strings(&["my file.txt", "out", "3"])));
}

#[test]
fn safe_bins_pass_only_while_they_name_no_file() {
    let policy = allowlist(&[]);
    let covers = |words: &[&str]| {
        let words = strings(words);
        policy.covers(&words[0], &words[1..])
    };
    for ok in [
        &["head", "-n", "5"][..],
        &["head", "-5"],
        &["tail", "-n5"],
        &["wc", "-l"],
        &["wc", "-lw"],
        &["cut", "-d", ",", "-f", "1"],
        &["cut", "-d,", "-f1"],
        &["sort", "-rn"],
        &["sort", "-k", "2", "-t", ":"],
        &["uniq", "-c"],
        &["tr", "a-z", "A-Z"],
        &["tr", "-d", "x"],
    ] {
        assert_eq!(covers(ok), Coverage::SafeBin, "{ok:?}");
    }
    for file in [
        &["head", "secret.txt"][..],
        &["head", "-n", "5", "secret.txt"],
        &["wc", "-l", "secret.txt"],
        &["sort", "-o", "out.txt"],
        &["sort", "--files0-from=list"],
        &["cut", "-f1", "data.csv"],
        &["uniq", "in", "out"],
    ] {
        assert!(matches!(covers(file), Coverage::Miss(_)), "{file:?}");
    }
}

#[test]
fn a_plan_binds_its_arguments() {
    let command = PlannedCommand {
        program: Some("rm".into()),
        written: "rm".into(),
        args: vec![
            PlannedArg {
                written: "-r".into(),
                matches: ArgMatch::Exact("-r".into()),
            },
            PlannedArg {
                written: "\"out-$N\"".into(),
                matches: ArgMatch::Glob("out-*".into()),
            },
            PlannedArg {
                written: "*.tmp".into(),
                matches: ArgMatch::Any,
            },
        ],
        redirections: Vec::new(),
    };
    assert!(command.matches("rm", &strings(&["-r", "out-1"])));
    assert!(command.matches("rm", &strings(&["-r", "out-1", "a.tmp", "b.tmp"])));
    assert!(!command.matches("rm", &strings(&["-rf", "out-1"])));
    assert!(!command.matches("rm", &strings(&["-r", "src"])));
    assert!(!command.matches("mv", &strings(&["-r", "out-1"])));
    // A part known only at run time never climbs out of the directory the plan named.
    assert!(!command.matches("rm", &strings(&["-r", "out-/../victim.txt"])));
    assert!(!command.matches("rm", &strings(&["-r", "out-x/../../victim.txt"])));
    let approved = ApprovedExec {
        policy: allowlist(&[]),
        approved: vec![command.clone()],
        approved_writes: Vec::new(),
    };
    assert!(approved.check("rm", &strings(&["-r", "out-2"])).is_ok());
    assert!(
        approved
            .check("coreutils", &strings(&["rm", "-r", "out-2"]))
            .is_ok()
    );
    let refused = approved
        .check("rm", &strings(&["-r", "/"]))
        .expect_err("outside the plan")
        .to_string();
    assert!(refused.contains("needs its own approval"), "{refused}");
    let entry = AllowEntry::exactly(&command).expect("named program");
    assert_eq!(entry.to_string(), "rm -r out-* *");
}

fn write(redirection: &str, target: ArgMatch) -> PlannedWrite {
    PlannedWrite {
        redirection: redirection.to_string(),
        target,
    }
}

#[test]
fn a_write_by_redirection_is_never_covered_by_an_allowlist_entry() {
    let policy = allowlist(&["ls *", "cat *"]);
    let notes = write("> notes.txt", ArgMatch::Exact("notes.txt".into()));
    assert_eq!(
        policy.covers_write(&notes),
        Coverage::Miss(
            "`> notes.txt` writes a file, and writes by redirection are not on the allowlist"
                .to_string()
        )
    );
    let full = ExecPolicy {
        mode: ExecMode::Full,
        ..policy.clone()
    };
    assert_eq!(full.covers_write(&notes), Coverage::Full);
    // `sort < a > b`: the safe bin is covered, its write is not, and the reason names the
    // redirection, not a program.
    let plan = ExecPlan {
        command: "sort < a > copy.txt".into(),
        commands: vec![PlannedCommand {
            program: Some("sort".into()),
            written: "sort".into(),
            args: Vec::new(),
            redirections: vec!["< a".into(), "> copy.txt".into()],
        }],
        writes: vec![write("> copy.txt", ArgMatch::Exact("copy.txt".into()))],
    };
    assert_eq!(
        policy.misses(&plan),
        ["`> copy.txt` writes a file, and writes by redirection are not on the allowlist"]
    );
    assert!(full.misses(&plan).is_empty());
    assert_eq!(
        plan.summary(),
        "sort < a > copy.txt\nwrites a file: > copy.txt"
    );
    // A plan without writes (an older component's) still reads; one with writes round-trips.
    let old: ExecPlan =
        serde_json::from_str(r#"{"command":"ls","commands":[]}"#).expect("old plan");
    assert!(old.writes.is_empty());
    let json = serde_json::to_string(&plan).expect("json");
    assert_eq!(serde_json::from_str::<ExecPlan>(&json).expect("back"), plan);
}

#[test]
fn the_host_refuses_a_write_by_redirection_the_decision_did_not_approve() {
    let nothing = ApprovedExec {
        policy: allowlist(&["cat *"]),
        approved: Vec::new(),
        approved_writes: Vec::new(),
    };
    let refused = nothing
        .check_write("/ws/notes.txt", false)
        .expect_err("not approved")
        .to_string();
    assert!(
        refused.contains(
            "`> /ws/notes.txt` writes a file, and writes by redirection are not on the allowlist"
        ),
        "{refused}"
    );
    assert!(!refused.contains("cat"), "{refused}");
    let refused = nothing
        .check_write("/ws/log", true)
        .expect_err("not approved")
        .to_string();
    assert!(refused.contains("`>> /ws/log`"), "{refused}");
    // Approved writes pass, and only at the paths they name.
    let approved = ApprovedExec {
        approved_writes: vec![
            write("> copy.txt", ArgMatch::Exact("copy.txt".into())),
            write("> /ws/abs.txt", ArgMatch::Exact("/ws/abs.txt".into())),
            write("> \"out-$N\"", ArgMatch::Glob("out-*".into())),
        ],
        ..nothing.clone()
    };
    for ok in [
        "/ws/copy.txt",
        "/ws/sub/copy.txt",
        "/ws/abs.txt",
        "/ws/out-1",
    ] {
        assert!(approved.check_write(ok, false).is_ok(), "{ok}");
    }
    for refused in [
        "/ws/notes.txt",
        "/ws/xcopy.txt",
        "/ws/copy.txt.bak",
        "/ws/sub/abs.txt",
        "/ws/in-1",
    ] {
        assert!(approved.check_write(refused, false).is_err(), "{refused}");
    }
    // A target known only at run time was shown as such and matches any path.
    let any = ApprovedExec {
        approved_writes: vec![write("> $F", ArgMatch::Any)],
        ..nothing.clone()
    };
    assert!(any.check_write("/ws/anything", false).is_ok());
    // Under `full` every write passes; the planning instance (`deny`) writes nothing.
    let full = ApprovedExec {
        policy: ExecPolicy::default(),
        ..nothing.clone()
    };
    assert!(full.check_write("/ws/notes.txt", false).is_ok());
    let deny = ApprovedExec {
        policy: ExecPolicy {
            mode: ExecMode::Deny,
            ..ExecPolicy::default()
        },
        ..approved.clone()
    };
    assert!(deny.check_write("/ws/notes.txt", false).is_err());
}

#[test]
fn allowlist_entries_are_bare_program_names() {
    assert_eq!(
        AllowEntry::parse("rm -r build/*").expect("ok"),
        AllowEntry {
            program: "rm".into(),
            args: Some("-r build/*".into())
        }
    );
    assert!(AllowEntry::parse("/bin/rm").is_err());
    assert!(AllowEntry::parse("r*").is_err());
    assert!(AllowEntry::parse("  ").is_err());
    assert_eq!(
        ApprovalDecision::parse("a"),
        Some(ApprovalDecision::AllowAlways)
    );
    assert_eq!(
        ApprovalDecision::parse("allow-once"),
        Some(ApprovalDecision::AllowOnce)
    );
    assert_eq!(ApprovalDecision::parse("nope"), None);
    for mode in ExecMode::ALL {
        assert_eq!(mode.as_str().parse::<ExecMode>(), Ok(mode));
        assert_eq!(serde_json::to_value(mode).expect("json"), mode.as_str());
    }
    for mode in AskMode::ALL {
        assert_eq!(mode.as_str().parse::<AskMode>(), Ok(mode));
        assert_eq!(serde_json::to_value(mode).expect("json"), mode.as_str());
    }
    assert_eq!(
        "some".parse::<ExecMode>(),
        Err("use \"deny\", \"allowlist\" or \"full\"".to_string())
    );
}

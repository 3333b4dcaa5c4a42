//! `awk` and `jq` through the real exec tool on real files: per-group sums of a CSV column, `-v`,
//! pipelines, files written by awk, jq's selections and raw output, exact exit statuses. The
//! attack tests make awk write outside the workspace (absolute and through `..`), ask it to start
//! processes (`system()`, `cmd | getline`, `print | cmd`), loop forever and grow a string until the
//! memory cap, and feed jq a JSON text nested 100,000 deep and a 10 MB file; each ends as a clear
//! error or a result, nothing outside the workspace changes, and the host keeps serving.

use std::fmt::Write as _;
use std::fs;
use std::time::{Duration, Instant};

use clawcage_sandbox::{FsMode, Limits};
use clawcage_tests::outside::{Layout, assert_outside_untouched, exec_text as run};
use clawcage_tests::{exec_registry, exec_registry_with};

/// The shared layout, with a CSV and a JSON file in the workspace.
fn layout() -> Layout {
    let layout = clawcage_tests::outside::layout();
    let workspace = &layout.workspace;
    fs::write(
        workspace.join("sales.csv"),
        "region,item,amount\nnorth,apple,1.50\nsouth,pear,2.25\nnorth,plum,3\neast,fig,10\nsouth,kiwi,0.75\n",
    )
    .unwrap();
    fs::write(
        workspace.join("team.json"),
        r#"{"team":"core","members":[
            {"name":"ada","role":"dev","age":36},
            {"name":"bob","role":"ops","age":41},
            {"name":"cy","role":"dev","age":29}
        ]}"#,
    )
    .unwrap();
    layout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awk_sums_a_column_per_group() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let text = run(
        &registry,
        r#"awk -F, 'NR > 1 { sum[$1] += $3; n[$1]++ } END { for (r in sum) printf "%-6s %6.2f %d\n", r, sum[r], n[r] }' sales.csv | sort"#,
    )
    .await;
    assert_eq!(
        text,
        "east    10.00 1\nnorth    4.50 2\nsouth    3.00 2\n[exit status: 0]"
    );
    // -v, a pipeline in and out, string functions and a user function.
    let text = run(
        &registry,
        r#"cat sales.csv | awk -F, -v min=2 'function up(s) { return toupper(substr(s, 1, 1)) substr(s, 2) } NR > 1 && $3 >= min { print up($2), length($2) }' | sort -r"#,
    )
    .await;
    assert_eq!(text, "Plum 4\nPear 4\nFig 3\n[exit status: 0]");
    // Ranges, NR/NF and OFS.
    let text = run(
        &registry,
        r#"awk -F, -v OFS=: '/pear/,/fig/ { $1 = $1; print NR, NF, $0 }' sales.csv"#,
    )
    .await;
    assert_eq!(
        text,
        "3:3:south:pear:2.25\n4:3:north:plum:3\n5:3:east:fig:10\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awk_writes_files_in_the_workspace() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let text = run(
        &registry,
        r#"mkdir out && awk -F, 'NR > 1 { print $2 > ("out/" $1 ".txt") } END { print NR - 1 >> "out/count.txt" }' sales.csv && cat out/north.txt"#,
    )
    .await;
    assert_eq!(text, "apple\nplum\n[exit status: 0]");
    let out = layout.workspace.join("out");
    assert_eq!(
        fs::read_to_string(out.join("south.txt")).unwrap(),
        "pear\nkiwi\n"
    );
    assert_eq!(fs::read_to_string(out.join("count.txt")).unwrap(), "5\n");
    // getline from a file, and a program file given with -f.
    fs::write(
        layout.workspace.join("first.awk"),
        "BEGIN { while ((getline line < \"out/east.txt\") > 0) print \"east:\", line }\n",
    )
    .unwrap();
    assert_eq!(
        run(&registry, "awk -f first.awk").await,
        "east: fig\n[exit status: 0]"
    );
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_statuses_are_exact() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    assert_eq!(
        run(&registry, "awk 'BEGIN { exit 3 }'; echo $?").await,
        "3\n[exit status: 0]"
    );
    assert_eq!(
        run(
            &registry,
            "awk '{ exit NR + 40 } END { print \"end\" }' sales.csv"
        )
        .await,
        "end\n[exit status: 41]"
    );
    let text = run(&registry, "awk 'BEGIN {\n  x = \n}'").await;
    assert!(text.contains("awk: syntax error at line 2"), "{text}");
    assert!(text.ends_with("[exit status: 2]"), "{text}");
    let text = run(&registry, "awk '{ print }' missing.txt").await;
    assert!(text.contains("cannot open missing.txt"), "{text}");
    assert!(text.ends_with("[exit status: 2]"), "{text}");

    assert_eq!(
        run(&registry, "jq -e '.missing' team.json; echo $?").await,
        "null\n1\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "jq -e '.members[0].name' team.json").await,
        "\"ada\"\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "jq -e 'empty' team.json; echo $?").await,
        "4\n[exit status: 0]"
    );
    let text = run(&registry, "jq '.team.name' team.json").await;
    assert!(text.contains("jq: error (at team.json)"), "{text}");
    assert!(text.ends_with("[exit status: 5]"), "{text}");
    let text = run(&registry, "jq '.members[' team.json").await;
    assert!(text.contains("syntax error"), "{text}");
    assert!(text.ends_with("[exit status: 3]"), "{text}");
    fs::write(layout.workspace.join("bad.json"), "{\"a\": 1}\n{\"b\": }\n").unwrap();
    let text = run(&registry, "jq -c . bad.json").await;
    assert!(text.starts_with("{\"a\":1}\n"), "{text}");
    assert!(text.contains("line 2, column 7"), "{text}");
    assert!(text.ends_with("[exit status: 2]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq_filters_a_real_file_and_works_in_pipelines() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    assert_eq!(
        run(
            &registry,
            "jq -r --arg role dev '.members[] | select(.role == $role) | .name' team.json"
        )
        .await,
        "ada\ncy\n[exit status: 0]"
    );
    assert_eq!(
        run(
            &registry,
            "jq -c '.members | map({(.name): .age}) | add' team.json"
        )
        .await,
        "{\"ada\":36,\"bob\":41,\"cy\":29}\n[exit status: 0]"
    );
    assert_eq!(
        run(
            &registry,
            "jq -r '.members | group_by(.role)[] | \"\\(.[0].role) \\(map(.age) | add)\"' team.json"
        )
        .await,
        "dev 65\nops 41\n[exit status: 0]"
    );
    assert_eq!(
        run(
            &registry,
            "jq -r '.members[] | [.name, .age] | @csv' team.json"
        )
        .await,
        "\"ada\",36\n\"bob\",41\n\"cy\",29\n[exit status: 0]"
    );
    // A pipeline: cat into jq into sort; jq's compact lines into wc; awk's output into jq -R.
    assert_eq!(
        run(
            &registry,
            "cat team.json | jq -r '.members[].name' | sort -r"
        )
        .await,
        "cy\nbob\nada\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "jq -c '.members[]' team.json | wc -l").await,
        "3\n[exit status: 0]"
    );
    assert_eq!(
        run(
            &registry,
            "awk -F, 'NR > 1 { print $2 }' sales.csv | jq -R -s -c 'split(\"\\n\") | map(select(. != \"\")) | length'"
        )
        .await,
        "5\n[exit status: 0]"
    );
    // Pretty output with sorted keys, and --argjson.
    assert_eq!(
        run(
            &registry,
            "jq -S --argjson extra '{\"z\":1,\"a\":[true]}' -n '$extra'"
        )
        .await,
        "{\n  \"a\": [\n    true\n  ],\n  \"z\": 1\n}\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awk_cannot_write_outside_the_workspace() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    for command in [
        r#"awk 'BEGIN { print "owned" > "/etc/clawcage-awk-test" }'"#,
        r#"awk 'BEGIN { print "owned" > "../escaped.txt" }'"#,
        r#"awk 'BEGIN { printf "owned" >> "../secret.txt" }'"#,
        r#"mkdir -p sub && cd sub && awk 'BEGIN { print "owned" > "../../escaped.txt" }'"#,
        r#"awk '{ print > "/tmp/clawcage-awk-test" }' sales.csv"#,
    ] {
        let text = run(&registry, command).await;
        assert!(text.contains("cannot open"), "{command}: {text}");
        assert!(text.ends_with("[exit status: 2]"), "{command}: {text}");
    }
    assert!(!std::path::Path::new("/etc/clawcage-awk-test").exists());
    assert!(!std::path::Path::new("/tmp/clawcage-awk-test").exists());
    // Reading outside is refused too.
    let text = run(&registry, "awk '{ print }' ../secret.txt").await;
    assert!(!text.contains("TOP-SECRET"), "{text}");
    assert!(text.ends_with("[exit status: 2]"), "{text}");
    let text = run(
        &registry,
        r#"awk 'BEGIN { r = getline line < "../secret.txt"; print r, line }'"#,
    )
    .await;
    assert_eq!(text, "-1 \n[exit status: 0]");
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awk_cannot_start_processes_and_says_so() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    for command in [
        r#"awk 'BEGIN { system("ls") }'"#,
        r#"awk 'BEGIN { "ls" | getline x; print x }'"#,
        r#"awk '{ print | "sort" }' sales.csv"#,
        r#"awk 'BEGIN { while (("cat ../secret.txt" | getline line) > 0) print line }'"#,
    ] {
        let text = run(&registry, command).await;
        assert!(
            text.contains("cannot start other programs"),
            "{command}: {text}"
        );
        assert!(!text.contains("crashed"), "{command}: {text}");
        assert!(!text.contains("TOP-SECRET"), "{command}: {text}");
        assert!(text.ends_with("[exit status: 2]"), "{command}: {text}");
    }
    // What came before the refusal is still written.
    assert_eq!(
        run(
            &registry,
            r#"awk 'BEGIN { print "before"; system("true") }' 2>/dev/null"#
        )
        .await,
        "before\n[exit status: 2]"
    );
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_awk_loop_stops_at_the_time_limit() {
    let layout = layout();
    let limits = Limits {
        timeout: Duration::from_secs(3),
        ..Limits::default()
    };
    let registry = exec_registry_with(&layout.workspace, FsMode::ReadWrite, limits).await;
    run(&registry, "awk 'BEGIN { print 1 }'").await;
    let started = Instant::now();
    let text = run(&registry, "awk 'BEGIN { while (1) {} }'").await;
    assert!(text.starts_with("ERROR failed"), "{text}");
    assert!(text.contains("time limit"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(20), "it did stop");
    assert_eq!(
        run(&registry, "awk 'END { print NR }' sales.csv").await,
        "6\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awk_memory_bomb_is_stopped_by_the_memory_cap() {
    let layout = layout();
    let limits = Limits {
        memory_bytes: 64 << 20,
        timeout: Duration::from_secs(20),
        ..Limits::default()
    };
    let registry = exec_registry_with(&layout.workspace, FsMode::ReadWrite, limits).await;
    let text = run(&registry, r#"awk 'BEGIN { s = "x"; while (1) s = s s }'"#).await;
    assert!(text.contains("memory limit of 64 MiB"), "{text}");
    assert!(!text.ends_with("[exit status: 0]"), "{text}");
    // So is an array that grows without end.
    let text = run(
        &registry,
        r#"awk 'BEGIN { while (1) a[n++] = n "xxxxxxxxxxxxxxxx" }'"#,
    )
    .await;
    assert!(text.contains("memory limit of 64 MiB"), "{text}");
    assert_eq!(
        run(&registry, "awk 'END { print NR }' sales.csv").await,
        "6\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq_refuses_deeply_nested_input_without_crashing() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    fs::write(layout.workspace.join("deep.json"), "[".repeat(100_000)).unwrap();
    let text = run(&registry, "jq . deep.json").await;
    assert!(text.contains("nested deeper than 1000 levels"), "{text}");
    assert!(text.ends_with("[exit status: 2]"), "{text}");
    let closed = format!(
        "{}{}",
        "{\"a\":".repeat(100_000),
        "1".to_owned() + &"}".repeat(100_000)
    );
    fs::write(layout.workspace.join("deep-objects.json"), closed).unwrap();
    let text = run(&registry, "cat deep-objects.json | jq -c .a").await;
    assert!(text.contains("nested deeper than"), "{text}");
    assert!(!text.ends_with("[exit status: 0]"), "{text}");
    // At the limit, deep input works: parsed, filtered, printed.
    let fine = format!("{}{}", "[".repeat(1_000), "]".repeat(1_000));
    fs::write(layout.workspace.join("fine.json"), fine).unwrap();
    assert_eq!(
        run(&registry, "jq -c 'flatten' fine.json").await,
        "[]\n[exit status: 0]"
    );
    // A filter that builds a deep value ends as an error result, not a host crash.
    let text = run(
        &registry,
        "jq -n -c 'reduce range(1000000) as $i (null; [.])'",
    )
    .await;
    assert!(
        !text.ends_with("[exit status: 0]"),
        "{}",
        &text[..text.len().min(300)]
    );
    assert_eq!(
        run(&registry, "jq -r .team team.json").await,
        "core\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_megabyte_json_file_and_ten_thousand_lines() {
    let layout = layout();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let mut big = String::from("[");
    let mut id: usize = 0;
    while big.len() < 10 << 20 {
        if id > 0 {
            big.push(',');
        }
        write!(
            big,
            r#"{{"id":{id},"name":"item-{id}","tags":["a","b"],"price":{}.5}}"#,
            id % 100
        )
        .unwrap();
        id += 1;
    }
    big.push(']');
    fs::write(layout.workspace.join("big.json"), &big).unwrap();
    let started = Instant::now();
    let text = run(&registry, "jq 'length' big.json").await;
    assert_eq!(text, format!("{id}\n[exit status: 0]"));
    let text = run(
        &registry,
        "jq -c '.[] | select(.id % 10000 == 0) | .name' big.json | wc -l",
    )
    .await;
    let expected = id.div_ceil(10_000);
    assert_eq!(text, format!("{expected}\n[exit status: 0]"));
    eprintln!("jq on {} bytes, twice: {:?}", big.len(), started.elapsed());

    // 10,000 lines: awk sums and counts, jq reads them as raw lines.
    let lines: String = (0..10_000)
        .map(|n| format!("user{} {} {}\n", n % 7, n, n % 13))
        .collect();
    fs::write(layout.workspace.join("lines.txt"), lines).unwrap();
    let started = Instant::now();
    let text = run(
        &registry,
        "awk '{ s[$1] += $2; t += $3 } END { print length(s), s[\"user0\"], t }' lines.txt",
    )
    .await;
    let user0: u64 = (0..10_000u64).filter(|n| n % 7 == 0).sum();
    let total: u64 = (0..10_000u64).map(|n| n % 13).sum();
    assert_eq!(text, format!("7 {user0} {total}\n[exit status: 0]"));
    eprintln!("awk over 10,000 lines: {:?}", started.elapsed());
    let started = Instant::now();
    let text = run(
        &registry,
        "jq -R -n '[inputs | split(\" \")[1] | tonumber] | add' lines.txt",
    )
    .await;
    assert_eq!(text, format!("{}\n[exit status: 0]", 9_999 * 10_000 / 2));
    eprintln!("jq over 10,000 lines: {:?}", started.elapsed());
}

//! The exec tool end to end: the shell component, the `process` import and the bundled programs
//! in a real engine, on real files in a temporary workspace.

use std::fs;
use std::path::Path;

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{ExecGrant, FsMode, Grants, Limits, LoadError};
use clawcage_tests::{exec_registry, grants, sandbox};
use serde_json::json;

async fn exec(registry: &ToolRegistry, command: &str) -> String {
    registry
        .execute_value("exec", &json!({ "command": command }))
        .await
        .unwrap_or_else(|error| panic!("`{command}` failed: {error}"))
        .text
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("src/nested")).unwrap();
    fs::write(dir.path().join("src/a.rs"), "fn a() {}\n// TODO: one\n").unwrap();
    fs::write(
        dir.path().join("src/nested/b.rs"),
        "// TODO: two\n// todo lower\n",
    )
    .unwrap();
    fs::write(dir.path().join("src/c.txt"), "TODO: three\n").unwrap();
    fs::write(dir.path().join("f.txt"), "banana\nalpha\n").unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_lists_the_workspace() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let text = exec(&registry, "ls -la").await;
    assert!(text.contains("f.txt") && text.contains("src"), "{text}");
    assert!(text.ends_with("[exit status: 0]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_into_wc_streams_through_a_pipe() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let text = exec(&registry, "grep -rn TODO src | wc -l").await;
    assert!(text.starts_with("3\n"), "{text}");
    let text = exec(&registry, "grep -rn TODO src").await;
    assert!(text.contains("src/a.rs:2:// TODO: one"), "{text}");
    let text = exec(&registry, "grep -rli todo src | sort").await;
    assert_eq!(
        text,
        "src/a.rs\nsrc/c.txt\nsrc/nested/b.rs\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_and_sort() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let text = exec(&registry, "find . -name '*.rs' | sort").await;
    assert_eq!(text, "./src/a.rs\n./src/nested/b.rs\n[exit status: 0]");
    let text = exec(&registry, "find src -maxdepth 1 -type d").await;
    assert_eq!(text, "src\nsrc/nested\n[exit status: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirect_then_cat() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let text = exec(&registry, "echo hi > out.txt && cat out.txt").await;
    assert_eq!(text, "hi\n[exit status: 0]");
    assert_eq!(
        fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "hi\n"
    );
    exec(
        &registry,
        "printf 'x\\n' >> out.txt; ls nope 2>/dev/null; wc -l < out.txt > n.txt",
    )
    .await;
    assert_eq!(fs::read_to_string(dir.path().join("n.txt")).unwrap(), "2\n");
    let text = exec(&registry, "ls nope 2>&1 | grep -c nope").await;
    assert!(text.starts_with("1\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sed_edits_in_place() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    exec(&registry, "sed -i 's/a/b/g' f.txt").await;
    assert_eq!(
        fs::read_to_string(dir.path().join("f.txt")).unwrap(),
        "bbnbnb\nblphb\n"
    );
    let text = exec(&registry, "sed -n '2p' f.txt").await;
    assert_eq!(text, "blphb\n[exit status: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mv_renames_and_moves_inside_the_workspace() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let text = exec(
        &registry,
        "mv -v f.txt g.txt && mkdir out && mv g.txt src/c.txt out && mv out done && cd src && mv nested ../moved",
    )
    .await;
    assert!(text.ends_with("[exit status: 0]"), "{text}");
    assert!(text.starts_with("renamed 'f.txt' -> 'g.txt'\n"), "{text}");
    let root = dir.path();
    assert_eq!(
        fs::read_to_string(root.join("done/g.txt")).unwrap(),
        "banana\nalpha\n"
    );
    assert!(root.join("done/c.txt").exists() && root.join("moved/b.rs").exists());
    assert!(!root.join("f.txt").exists() && !root.join("src/nested").exists());
    // Refusals in GNU's words, nothing moved.
    let text = exec(
        &registry,
        "mv missing x; mv done done/inner; mv src/a.rs ../../x",
    )
    .await;
    assert!(
        text.contains("mv: cannot stat 'missing': No such file or directory"),
        "{text}"
    );
    assert!(text.contains("to a subdirectory of itself"), "{text}");
    assert!(
        text.contains("mv: cannot move 'src/a.rs' to '../../x'"),
        "{text}"
    );
    assert!(root.join("src/a.rs").exists() && root.join("done").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_r_copies_a_tree_inside_the_workspace() {
    let dir = workspace();
    std::os::unix::fs::symlink("a.rs", dir.path().join("src/link.rs")).unwrap();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let text = exec(
        &registry,
        "cp -r src copy && mkdir into && cp -R src f.txt into && cp -rv src into",
    )
    .await;
    assert!(text.ends_with("[exit status: 0]"), "{text}");
    let root = dir.path();
    assert_eq!(
        fs::read_to_string(root.join("copy/nested/b.rs")).unwrap(),
        "// TODO: two\n// todo lower\n"
    );
    assert_eq!(
        fs::read_link(root.join("copy/link.rs")).unwrap(),
        Path::new("a.rs")
    );
    assert!(root.join("into/src/a.rs").exists() && root.join("into/f.txt").exists());
    assert!(text.contains("'src/a.rs' -> 'into/src/a.rs'"), "{text}");
    // Into itself, and out of the workspace: refused, nothing copied there.
    let text = exec(
        &registry,
        "cp -r src src/nested/again; cp -r src ../../outside",
    )
    .await;
    assert!(text.contains("into itself"), "{text}");
    assert!(!text.ends_with("[exit status: 0]"), "{text}");
    assert!(!root.join("src/nested/again").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realpath_and_readlink_f_resolve_inside_the_workspace() {
    let dir = workspace();
    std::os::unix::fs::symlink("src/nested", dir.path().join("deep")).unwrap();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let root = dir.path().canonicalize().unwrap();
    let text = exec(
        &registry,
        "realpath deep/b.rs f.txt && cd src && readlink -f ../deep && realpath -m ../new/file",
    )
    .await;
    let shown = root.display();
    assert_eq!(
        text,
        format!(
            "{shown}/src/nested/b.rs\n{shown}/f.txt\n{shown}/src/nested\n{shown}/new/file\n[exit status: 0]"
        )
    );
    // Outside the workspace nothing exists, and a missing middle fails.
    let text = exec(&registry, "realpath /etc/passwd; realpath missing/x").await;
    assert!(
        text.contains("realpath: /etc/passwd: No such file or directory"),
        "{text}"
    );
    assert!(text.contains("realpath: missing/x:"), "{text}");
    assert!(!text.ends_with("[exit status: 0]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cd_changes_the_working_directory_of_programs() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let root = dir.path().canonicalize().unwrap();
    let text = exec(&registry, "cd src && pwd").await;
    assert_eq!(text, format!("{}/src\n[exit status: 0]", root.display()));
    let text = exec(&registry, "cd src/nested && cat b.rs | head -1 && ls ..").await;
    assert!(text.starts_with("// TODO: two\n"), "{text}");
    assert!(text.contains("a.rs"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_and_status_variable() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    assert_eq!(
        exec(&registry, "false; echo $?").await,
        "1\n[exit status: 0]"
    );
    assert_eq!(
        exec(&registry, "true && echo yes || echo no").await,
        "yes\n[exit status: 0]"
    );
    assert_eq!(
        exec(&registry, "grep -q nothing f.txt || echo missing").await,
        "missing\n[exit status: 0]"
    );
    assert_eq!(exec(&registry, "exit 3").await, "[exit status: 3]");
    // The bundled programs' own statuses, exactly as their native counterparts give them.
    assert!(
        exec(&registry, "ls /nope")
            .await
            .ends_with("[exit status: 2]")
    );
    assert_eq!(
        exec(
            &registry,
            "grep -q x missing.txt 2>/dev/null; echo $?; grep -q banana f.txt; echo $?; grep -q kiwi f.txt; echo $?"
        )
        .await,
        "2\n0\n1\n[exit status: 0]"
    );
    assert_eq!(
        exec(
            &registry,
            "test 1 -gt 2; echo $?; [ a = a ]; echo $?; test 1 -gt 2>/dev/null; echo $?; expr 1 + x 2>/dev/null; echo $?"
        )
        .await,
        "1\n0\n2\n2\n[exit status: 0]"
    );
    assert_eq!(
        exec(
            &registry,
            "sort --bogus 2>/dev/null; echo $?; find nope 2>/dev/null; echo $?; sed -e 'k' f.txt 2>/dev/null; echo $?"
        )
        .await,
        "2\n1\n1\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoting_variables_globs_and_substitution() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let text = exec(
        &registry,
        "X='a b'; export Y=\"$X c\"; echo \"${Y}\" '$X' \\$X",
    )
    .await;
    assert_eq!(text, "a b c $X $X\n[exit status: 0]");
    assert_eq!(
        exec(&registry, "echo src/*.rs").await,
        "src/a.rs\n[exit status: 0]"
    );
    assert_eq!(
        exec(&registry, "echo 'src/*.rs'").await,
        "src/*.rs\n[exit status: 0]"
    );
    assert_eq!(
        exec(&registry, "n=$(ls src | wc -l); echo \"$n files\"").await,
        "3 files\n[exit status: 0]"
    );
    assert_eq!(
        exec(&registry, "echo `echo back`").await,
        "back\n[exit status: 0]"
    );
    let text = exec(
        &registry,
        "for f in src/*.rs; do echo \"file ${f##*/}\"; done",
    )
    .await;
    assert_eq!(text, "file a.rs\n[exit status: 0]");
    let text = exec(
        &registry,
        "sh -c 'echo $0 $1' name arg && bash -c 'cd src; pwd' | grep -c src",
    )
    .await;
    assert!(text.starts_with("name arg\n1\n"), "{text}");
    let text = exec(&registry, "cat <<EOF\nline $((1+2))\nEOF").await;
    assert_eq!(text, "line 3\n[exit status: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yes_into_head_ends_when_head_exits() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let text = exec(&registry, "yes | head -3").await;
    assert_eq!(text, "y\ny\ny\n[exit status: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_programs_name_what_exists() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let text = exec(&registry, "frobnicate --now").await;
    assert!(text.contains("command not found: frobnicate"), "{text}");
    assert!(
        text.contains("available programs:") && text.contains(" grep "),
        "{text}"
    );
    assert!(text.ends_with("[exit status: 127]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_programs_join_the_catalog() {
    let dir = workspace();
    let programs = tempfile::tempdir().unwrap();
    fs::write(
        programs.path().join("mygrep.wasm"),
        bundled::GREP.bytes().unwrap(),
    )
    .unwrap();
    let sandbox = sandbox();
    let catalog = sandbox.programs(Some(programs.path())).await.unwrap();
    assert!(catalog.names().contains(&"mygrep".to_string()));
    let grants =
        grants(dir.path(), FsMode::ReadWrite, Limits::default()).with_exec(ExecGrant::new(catalog));
    let registry = clawcage_tests::registry_of(&[("exec", bundled::EXEC)], grants).await;
    let text = exec(&registry, "mygrep -c TODO src/c.txt").await;
    assert_eq!(text, "1\n[exit status: 0]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_importing_process_without_the_grant_fails_to_load() {
    let dir = workspace();
    let error = sandbox()
        .load(
            "exec",
            "test:exec",
            bundled::EXEC,
            grants(dir.path(), FsMode::ReadWrite, Limits::default()),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, LoadError::UngrantedImport { .. }),
        "{error}"
    );
    let message = error.to_string();
    assert!(message.contains("clawcage:tool/process"), "{message}");
    assert!(message.contains("exec capability"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowing_without_exec_drops_it() {
    let dir = workspace();
    let catalog = clawcage_tests::programs().await;
    let plain: Grants = grants(dir.path(), FsMode::ReadWrite, Limits::default());
    let parent = plain.clone().with_exec(ExecGrant::new(catalog));
    assert!(parent.narrowed_by(&plain).exec.is_none());
    assert!(plain.narrowed_by(&parent).exec.is_none());
    let kept = parent.narrowed_by(&parent);
    assert_eq!(kept.exec, parent.exec);
    assert!(kept.describe().contains("exec ("), "{}", kept.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_outputs_into_one_file_keep_both_in_order() {
    let dir = workspace();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    let read = |name: &str| fs::read_to_string(dir.path().join(name)).unwrap();

    // A builtin with `2>&1`: its output and its (empty) errors are one open of the file.
    let text = exec(&registry, "echo x > f 2>&1").await;
    assert_eq!(text, "[exit status: 0]");
    assert_eq!(read("f"), "x\n");
    exec(&registry, "echo z &> f").await;
    assert_eq!(read("f"), "z\n");
    exec(&registry, "echo a > f; echo b >> f 2>&1").await;
    assert_eq!(read("f"), "a\nb\n");

    // A group: a builtin's output, a builtin's and a program's errors, in the order written.
    exec(&registry, "{ echo a; echo b >&2; } > f 2>&1").await;
    assert_eq!(read("f"), "a\nb\n");
    let text = exec(&registry, "{ echo out; ls missing-file; } > f 2>&1").await;
    assert!(
        text.ends_with("[exit status: 2]") || text.ends_with("[exit status: 1]"),
        "{text}"
    );
    assert!(
        !text.contains("missing-file"),
        "the error went to the model: {text}"
    );
    let both = read("f");
    assert!(both.starts_with("out\n"), "{both}");
    assert!(both.contains("missing-file"), "{both}");

    // Two files stay two: output in one, the empty errors in the other.
    exec(&registry, "echo y > g 2> h").await;
    assert_eq!(read("g"), "y\n");
    assert_eq!(read("h"), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_takes_a_files_lines_exactly_and_redirections_each_open_their_file() {
    let dir = workspace();
    fs::write(
        dir.path().join("lines.txt"),
        "  two spaces  \n\ttab\\kept\nlast without newline",
    )
    .unwrap();
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    // The idiom for every line, exactly, the unended last one included.
    let text = exec(
        &registry,
        "cat lines.txt | while IFS= read -r line || [ -n \"$line\" ]; do echo \"[$line]\"; done",
    )
    .await;
    assert_eq!(
        text,
        "[  two spaces  ]\n[\ttab\\kept]\n[last without newline]\n[exit status: 0]"
    );
    // Fields by IFS from a program's output; a prompt changes nothing without a terminal.
    let text = exec(
        &registry,
        "printf 'root:x:0:0:/root\\n' | { IFS=: read -rp 'user? ' user pass rest; echo \"$user|$rest\"; }; echo \"IFS:[$IFS]\"",
    )
    .await;
    assert!(text.starts_with("root|0:0:/root\n"), "{text}");
    assert!(
        !text.contains("IFS:[:]"),
        "IFS is put back after the read: {text}"
    );
    // Every file named by a redirection is opened (created), the output going to the last.
    let text = exec(&registry, "echo hi > first.txt > second.txt; echo done").await;
    assert_eq!(text, "done\n[exit status: 0]");
    assert_eq!(
        fs::read_to_string(dir.path().join("first.txt")).unwrap(),
        ""
    );
    assert_eq!(
        fs::read_to_string(dir.path().join("second.txt")).unwrap(),
        "hi\n"
    );
}

//! `diff`, `cmp` and `patch` (the bundled diffutils program) through the real exec tool on real
//! files: exact output and exit statuses, directory comparison, the diff-then-patch round trip,
//! git-style patches, dry runs, moved and failing hunks, created and deleted files. The attack
//! tests give patch names that lead out of the workspace (`..`, absolute, a symbolic link) and
//! malformed patches, and check that nothing outside the workspace changes; two large, very
//! different files are compared within the time limit.

use std::fs;
use std::time::{Duration, Instant, SystemTime};

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::FsMode;
use clawcage_tests::exec_registry;
use clawcage_tests::outside::{Layout, assert_outside_untouched, layout};
use serde_json::json;

/// Files of the shared layout's workspace, by name.
trait WorkspaceFiles {
    fn write(&self, name: &str, text: &str);
    fn read(&self, name: &str) -> String;
    /// Set a file's modification time, so unified headers are known in advance.
    fn set_time(&self, name: &str, seconds: u64);
}

impl WorkspaceFiles for Layout {
    fn write(&self, name: &str, text: &str) {
        let path = self.workspace.join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.workspace.join(name))
            .unwrap_or_else(|error| panic!("reading {name}: {error}"))
    }

    fn set_time(&self, name: &str, seconds: u64) {
        let file = fs::File::options()
            .write(true)
            .open(self.workspace.join(name))
            .unwrap();
        file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
            .unwrap();
    }
}

async fn exec(registry: &ToolRegistry, command: &str) -> String {
    registry
        .execute_value("exec", &json!({ "command": command }))
        .await
        .unwrap_or_else(|error| panic!("`{command}` failed: {error}"))
        .text
}

const OLD: &str = "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n";
const NEW: &str = "one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\nnine\nten\neleven\n";

/// 2023-11-14 22:13:20 UTC.
const OLD_TIME: u64 = 1_700_000_000;
/// One hour later.
const NEW_TIME: u64 = 1_700_003_600;

fn old_and_new() -> Layout {
    let layout = layout();
    layout.write("old.txt", OLD);
    layout.write("new.txt", NEW);
    layout.set_time("old.txt", OLD_TIME);
    layout.set_time("new.txt", NEW_TIME);
    layout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_prints_unified_and_normal_output_exactly() {
    let layout = old_and_new();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    assert_eq!(
        exec(&registry, "diff -u old.txt new.txt").await,
        "--- old.txt\t2023-11-14 22:13:20.000000000 +0000\n\
         +++ new.txt\t2023-11-14 23:13:20.000000000 +0000\n\
         @@ -1,6 +1,6 @@\n one\n two\n-three\n+THREE\n four\n five\n six\n\
         @@ -8,3 +8,4 @@\n eight\n nine\n ten\n+eleven\n[exit status: 1]"
    );
    assert_eq!(
        exec(
            &registry,
            "diff -U1 --label a/x --label b/x old.txt new.txt"
        )
        .await,
        "--- a/x\n+++ b/x\n@@ -2,3 +2,3 @@\n two\n-three\n+THREE\n four\n\
         @@ -10 +10,2 @@\n ten\n+eleven\n[exit status: 1]"
    );
    assert_eq!(
        exec(&registry, "diff old.txt new.txt").await,
        "3c3\n< three\n---\n> THREE\n10a11\n> eleven\n[exit status: 1]"
    );
    assert_eq!(
        exec(&registry, "diff -q old.txt new.txt").await,
        "Files old.txt and new.txt differ\n[exit status: 1]"
    );
    assert_eq!(
        exec(
            &registry,
            "printf 'x\\n' > a; printf 'x' > b; diff -u --label a --label b a b"
        )
        .await,
        "--- a\n+++ b\n@@ -1 +1 @@\n-x\n+x\n\\ No newline at end of file\n[exit status: 1]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_exit_statuses_are_exact() {
    let layout = old_and_new();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    assert_eq!(
        exec(&registry, "diff old.txt old.txt; echo $?").await,
        "0\n[exit status: 0]"
    );
    assert_eq!(
        exec(&registry, "diff -q old.txt new.txt > /dev/null; echo $?").await,
        "1\n[exit status: 0]"
    );
    let text = exec(&registry, "diff old.txt missing.txt; echo $?").await;
    assert_eq!(
        text,
        "diff: missing.txt: No such file or directory\n2\n[exit status: 0]"
    );
    assert_eq!(
        exec(&registry, "diff -s old.txt old.txt").await,
        "Files old.txt and old.txt are identical\n[exit status: 0]"
    );
    assert_eq!(
        exec(
            &registry,
            "diff --frobnicate old.txt new.txt > /dev/null 2>&1; echo $?"
        )
        .await,
        "2\n[exit status: 0]"
    );
    // Ignoring white space and case makes these equal.
    layout.write("spaced.txt", "ONE\ntwo  \nthree\n");
    layout.write("plain.txt", "one\ntwo\nthree\n");
    assert_eq!(
        exec(&registry, "diff -i -b plain.txt spaced.txt; echo $?").await,
        "0\n[exit status: 0]"
    );
    // Standard input as one side.
    assert_eq!(
        exec(&registry, "cat old.txt | diff - old.txt; echo $?").await,
        "0\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmp_locates_the_first_difference() {
    let layout = old_and_new();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    assert_eq!(
        exec(&registry, "cmp old.txt new.txt").await,
        "old.txt new.txt differ: byte 9, line 3\n[exit status: 1]"
    );
    assert_eq!(
        exec(&registry, "cmp old.txt old.txt; echo $?").await,
        "0\n[exit status: 0]"
    );
    assert_eq!(
        exec(&registry, "cmp -s old.txt new.txt; echo $?").await,
        "1\n[exit status: 0]"
    );
    layout.write("short.txt", "one\ntwo\n");
    assert_eq!(
        exec(&registry, "cmp short.txt old.txt").await,
        "cmp: EOF on short.txt after byte 8, line 2\n[exit status: 1]"
    );
    layout.write("x1", "abcdef");
    layout.write("x2", "aXcdeY");
    assert_eq!(
        exec(&registry, "cmp -l x1 x2").await,
        "2 142 130\n6 146 131\n[exit status: 1]"
    );
    assert_eq!(
        exec(&registry, "cmp old.txt nothing.txt; echo $?").await,
        "cmp: nothing.txt: No such file or directory\n2\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_r_compares_directories() {
    let layout = layout();
    for (name, text) in [
        ("a/same.txt", "same\n"),
        ("a/changed.txt", "before\n"),
        ("a/only-in-a.txt", "a\n"),
        ("a/sub/deep.txt", "old\n"),
        ("a/gone/x.txt", "x\n"),
        ("b/same.txt", "same\n"),
        ("b/changed.txt", "after\n"),
        ("b/only-in-b.txt", "b\n"),
        ("b/sub/deep.txt", "new\n"),
    ] {
        layout.write(name, text);
    }
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    assert_eq!(
        exec(&registry, "diff -r a b").await,
        "diff -r a/changed.txt b/changed.txt\n1c1\n< before\n---\n> after\n\
         Only in a: gone\nOnly in a: only-in-a.txt\nOnly in b: only-in-b.txt\n\
         diff -r a/sub/deep.txt b/sub/deep.txt\n1c1\n< old\n---\n> new\n[exit status: 1]"
    );
    assert_eq!(
        exec(&registry, "diff -q a b").await,
        "Files a/changed.txt and b/changed.txt differ\nOnly in a: gone\n\
         Only in a: only-in-a.txt\nOnly in b: only-in-b.txt\n\
         Common subdirectories: a/sub and b/sub\n[exit status: 1]"
    );
    assert_eq!(
        exec(&registry, "diff -r a/sub a/sub; echo $?").await,
        "0\n[exit status: 0]"
    );
    // The whole tree travels as one patch: -N makes files on one side new or deleted.
    let text = exec(
        &registry,
        "diff -ruN a b > tree.diff; cp -r a c && cd c && patch -p1 < ../tree.diff && cd .. && diff -r b c && echo same",
    )
    .await;
    assert!(text.ends_with("same\n[exit status: 0]"), "{text}");
    assert!(!layout.workspace.join("c/gone").exists(), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_then_patch_makes_the_old_file_new() {
    let layout = old_and_new();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let text = exec(
        &registry,
        "diff -u old.txt new.txt > p.diff; patch -p0 < p.diff && cmp old.txt new.txt && echo equal",
    )
    .await;
    assert_eq!(text, "patching file old.txt\nequal\n[exit status: 0]");
    assert_eq!(layout.read("old.txt"), NEW);
    // Undo it with -R, read from a file with -i.
    let text = exec(&registry, "patch -R -p0 -i p.diff").await;
    assert_eq!(text, "patching file old.txt\n[exit status: 0]");
    assert_eq!(layout.read("old.txt"), OLD);
    // A second -R finds nothing to undo, says so and changes nothing.
    let text = exec(&registry, "patch -R -p0 -i p.diff").await;
    assert_eq!(
        text,
        "patching file old.txt\nReversed (or previously applied) patch detected!  Skipping patch.\n\
         2 out of 2 hunks ignored\n[exit status: 1]"
    );
    assert_eq!(layout.read("old.txt"), OLD);
    // An explicit file to patch wins over the names in the patch.
    layout.write("copy.txt", OLD);
    assert_eq!(
        exec(&registry, "patch copy.txt p.diff").await,
        "patching file copy.txt\n[exit status: 0]"
    );
    assert_eq!(layout.read("copy.txt"), NEW);
}

const GIT_PATCH: &str = "\
diff --git a/src/lib.rs b/src/lib.rs
index 1b7c1e7..7527576 100644
--- a/src/lib.rs
+++ b/src/lib.rs
@@ -1,5 +1,5 @@
 pub fn greet() -> &'static str {
-    \"hi\"
+    \"hello\"
 }
 
 pub fn answer() -> u32 {
diff --git a/docs/new.md b/docs/new.md
new file mode 100644
index 0000000..3e75765
--- /dev/null
+++ b/docs/new.md
@@ -0,0 +1,2 @@
+# New
+Written by the patch.
diff --git a/old.txt b/old.txt
deleted file mode 100644
index 286c5f5..0000000
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-gone
";

const LIB_RS: &str =
    "pub fn greet() -> &'static str {\n    \"hi\"\n}\n\npub fn answer() -> u32 {\n    42\n}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_patches_apply_with_p1_and_dry_runs_change_nothing() {
    let layout = layout();
    layout.write("src/lib.rs", LIB_RS);
    layout.write("old.txt", "gone\n");
    layout.write("change.diff", GIT_PATCH);
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    assert_eq!(
        exec(&registry, "patch -p1 --dry-run < change.diff").await,
        "checking file src/lib.rs\nchecking file docs/new.md\nchecking file old.txt\n[exit status: 0]"
    );
    assert_eq!(layout.read("src/lib.rs"), LIB_RS);
    assert!(!layout.workspace.join("docs").exists());
    assert_eq!(layout.read("old.txt"), "gone\n");

    assert_eq!(
        exec(&registry, "patch -p1 < change.diff").await,
        "patching file src/lib.rs\npatching file docs/new.md\npatching file old.txt\n[exit status: 0]"
    );
    assert_eq!(
        layout.read("src/lib.rs"),
        LIB_RS.replace("\"hi\"", "\"hello\"")
    );
    assert_eq!(layout.read("docs/new.md"), "# New\nWritten by the patch.\n");
    assert!(!layout.workspace.join("old.txt").exists());
    // Undone, the tree is as it was: the created file and its directory go, the deleted returns.
    assert_eq!(
        exec(&registry, "patch -R -p1 -s < change.diff; echo $?").await,
        "0\n[exit status: 0]"
    );
    assert_eq!(layout.read("src/lib.rs"), LIB_RS);
    assert!(!layout.workspace.join("docs").exists());
    assert_eq!(layout.read("old.txt"), "gone\n");
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_hunks_apply_with_their_offset_and_wrong_ones_fail_cleanly() {
    let layout = old_and_new();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    exec(&registry, "diff -u old.txt new.txt > p.diff").await;
    // Three lines added at the top move both hunks down by three.
    let moved = format!("added 1\nadded 2\nadded 3\n{OLD}");
    layout.write("old.txt", &moved);
    assert_eq!(
        exec(&registry, "patch -p0 < p.diff").await,
        "patching file old.txt\nHunk #1 succeeded at 4 (offset 3 lines).\n\
         Hunk #2 succeeded at 11 (offset 3 lines).\n[exit status: 0]"
    );
    assert_eq!(
        layout.read("old.txt"),
        format!("added 1\nadded 2\nadded 3\n{NEW}")
    );

    // A file the first hunk cannot fit: nothing is written, the hunk goes to a .rej file.
    let different = OLD.replace("three", "3");
    layout.write("old.txt", &different);
    assert_eq!(
        exec(&registry, "patch -p0 < p.diff").await,
        "patching file old.txt\nHunk #1 FAILED at 1.\n\
         1 out of 2 hunks FAILED -- saving rejects to file old.txt.rej\n[exit status: 1]"
    );
    assert_eq!(
        layout.read("old.txt"),
        different,
        "a failed patch changed the file"
    );
    assert_eq!(
        layout.read("old.txt.rej"),
        "--- old.txt\n+++ old.txt\n@@ -1,6 +1,6 @@\n one\n two\n-three\n+THREE\n four\n five\n six\n"
    );
    // A dry run of the same says the same and writes no .rej.
    fs::remove_file(layout.workspace.join("old.txt.rej")).unwrap();
    assert_eq!(
        exec(&registry, "patch --dry-run -p0 < p.diff").await,
        "checking file old.txt\nHunk #1 FAILED at 1.\n1 out of 2 hunks FAILED\n[exit status: 1]"
    );
    assert!(!layout.workspace.join("old.txt.rej").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_creates_a_new_file() {
    let layout = layout();
    layout.write("made.txt", "brand\nnew\n");
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let text = exec(
        &registry,
        "diff -uN never.txt made.txt > create.diff; rm made.txt; patch -p0 < create.diff",
    )
    .await;
    assert_eq!(text, "patching file made.txt\n[exit status: 0]");
    assert_eq!(layout.read("made.txt"), "brand\nnew\n");
    assert!(
        layout
            .read("create.diff")
            .starts_with("--- /dev/null\n+++ made.txt\t")
    );
    // Applying it again would create a file that exists: refused, file unchanged.
    let text = exec(&registry, "patch -p0 < create.diff").await;
    assert!(
        text.contains("Reversed (or previously applied) patch detected!"),
        "{text}"
    );
    assert!(text.ends_with("[exit status: 1]"), "{text}");
    assert_eq!(layout.read("made.txt"), "brand\nnew\n");
}

/// Patches that name files outside the workspace are refused by name, before anything is
/// written, even when other parts of the same patch are harmless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_refuses_names_that_leave_the_workspace() {
    let layout = layout();
    layout.write("inside.txt", "inside\n");
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let harmless = |strip: &str| {
        let prefix = if strip == "-p1" { "x/" } else { "" };
        format!("--- {prefix}inside.txt\n+++ {prefix}inside.txt\n@@ -1 +1 @@\n-inside\n+changed\n")
    };
    let cases = [
        (
            "-p0",
            "--- ../secret.txt\n+++ ../secret.txt\n@@ -1 +1 @@\n-TOP-SECRET-HOST-DATA\n+pwned\n",
            "refusing to patch '../secret.txt'",
        ),
        (
            "-p0",
            "--- ../new-outside.txt\n+++ ../new-outside.txt\n@@ -0,0 +1 @@\n+pwned\n",
            "refusing to patch '../new-outside.txt'",
        ),
        (
            "-p0",
            "--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-root:x:0:0:root:/root:/bin/bash\n+pwned\n",
            "refusing to patch '/etc/passwd'",
        ),
        (
            "-p1",
            "--- a/../../x\n+++ b/../../x\n@@ -0,0 +1 @@\n+pwned\n",
            "refusing to patch '../../x'",
        ),
        (
            "-p0",
            "--- /dev/null\n+++ sub/../../escape.txt\n@@ -0,0 +1 @@\n+pwned\n",
            "refusing to patch 'sub/../../escape.txt'",
        ),
    ];
    for (strip, evil, refusal) in cases {
        // The harmless part comes first: it must not be applied either.
        layout.write("evil.diff", &format!("{}{evil}", harmless(strip)));
        let text = exec(&registry, &format!("patch {strip} < evil.diff")).await;
        assert!(text.contains(refusal), "{evil}: {text}");
        assert!(text.ends_with("[exit status: 2]"), "{evil}: {text}");
        assert_eq!(layout.read("inside.txt"), "inside\n", "{evil}: {text}");
        assert_outside_untouched(&layout);
    }
    // With the patch on standard input through a pipe, and with -i, the same.
    let text = exec(
        &registry,
        "printf -- '--- ../secret.txt\\n+++ ../secret.txt\\n@@ -1 +1 @@\\n-x\\n+y\\n' | patch -p0; echo $?",
    )
    .await;
    assert!(text.ends_with("2\n[exit status: 0]"), "{text}");
    assert_outside_untouched(&layout);
}

/// A symbolic link in the workspace that points outside it is no way out: patch refuses a
/// link by name, and naming the link as the file to patch meets the sandbox's refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_through_a_symlink_out_of_the_workspace_is_refused() {
    let layout = layout();
    std::os::unix::fs::symlink(
        layout.parent.join("secret.txt"),
        layout.workspace.join("link.txt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&layout.parent, layout.workspace.join("up")).unwrap();
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    let change = "@@ -1 +1 @@\n-TOP-SECRET-HOST-DATA\n+pwned\n";
    layout.write(
        "link.diff",
        &format!("--- link.txt\n+++ link.txt\n{change}"),
    );
    let text = exec(&registry, "patch -p0 < link.diff").await;
    assert!(
        text.contains("refusing to patch 'link.txt': 'link.txt' is a symbolic link"),
        "{text}"
    );
    assert!(text.ends_with("[exit status: 2]"), "{text}");
    layout.write(
        "up.diff",
        &format!("--- up/secret.txt\n+++ up/secret.txt\n{change}"),
    );
    let text = exec(&registry, "patch -p0 < up.diff").await;
    assert!(text.contains("'up' is a symbolic link"), "{text}");
    assert!(text.ends_with("[exit status: 2]"), "{text}");
    // Named on the command line, the link is opened through the sandbox, which refuses it.
    let text = exec(&registry, "patch link.txt link.diff").await;
    assert!(
        text.contains("cannot read link.txt: Permission denied"),
        "{text}"
    );
    assert!(text.ends_with("[exit status: 2]"), "{text}");
    assert!(!text.contains("TOP-SECRET"), "{text}");
    // diff and cmp cannot read through it either.
    let text = exec(&registry, "diff link.txt link.diff; cmp link.txt link.diff").await;
    assert!(!text.contains("TOP-SECRET"), "{text}");
    assert!(!text.ends_with("[exit status: 0]"), "{text}");
    assert_outside_untouched(&layout);
    assert!(
        fs::symlink_metadata(layout.workspace.join("link.txt"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_patches_fail_cleanly() {
    let layout = layout();
    layout.write("a.txt", "x\ny\nz\n");
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    // Programs are loaded on the first call: load them before the calls that are timed.
    exec(&registry, "echo warm | cat").await;
    let cases = [
        (
            "garbage",
            "this is not a patch\nat all\n",
            "Only garbage was found",
        ),
        (
            "truncated hunk",
            "--- a.txt\n+++ a.txt\n@@ -1,3 +1,3 @@\n x\n-y\n",
            "malformed patch",
        ),
        (
            "huge counts",
            "--- a.txt\n+++ a.txt\n@@ -1,99999999 +1,99999999 @@\n x\n-y\n+Y\n z\n",
            "malformed patch",
        ),
        (
            "overflowing counts",
            "--- a.txt\n+++ a.txt\n@@ -18446744073709551615,2 +1 @@\n x\n",
            "malformed patch",
        ),
        (
            "broken header",
            "--- a.txt\n+++ a.txt\n@@ -1,x +1 @@\n x\n",
            "malformed patch",
        ),
        (
            "binary noise",
            "--- a.txt\n+++ a.txt\n@@ -1 +1 @@\n\u{0}\u{1}\u{2}\u{ff}\n",
            "malformed patch",
        ),
    ];
    for (what, patch, message) in cases {
        layout.write("bad.diff", patch);
        let started = Instant::now();
        let text = exec(&registry, "patch -p0 < bad.diff").await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what} took too long"
        );
        assert!(text.contains(message), "{what}: {text}");
        assert!(text.ends_with("[exit status: 2]"), "{what}: {text}");
        assert_eq!(layout.read("a.txt"), "x\ny\nz\n", "{what}");
    }
    // An empty patch is garbage too.
    let text = exec(&registry, "patch -p0 < /dev/null").await;
    assert!(text.ends_with("[exit status: 2]"), "{text}");
    assert_outside_untouched(&layout);
}

/// Two 5 MB files that share almost nothing: the line matcher's time budget keeps diff well
/// inside the time limit, and the script it settles for still turns one into the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_very_different_files_finish_within_the_time_limit() {
    let layout = layout();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut first = String::new();
    let mut second = String::new();
    while first.len() < 5_000_000 {
        // Few distinct lines make many equal-looking candidates: the hard case for Myers.
        first.push_str(&format!("line {}\n", next() % 8));
        second.push_str(&format!("line {}\n", next() % 8));
    }
    layout.write("big1.txt", &first);
    layout.write("big2.txt", &second);
    let registry = exec_registry(&layout.workspace, FsMode::ReadWrite).await;
    // Programs are loaded on the first call: load them before the calls that are timed.
    exec(&registry, "echo warm | cat").await;
    let started = Instant::now();
    let text = exec(
        &registry,
        "diff big1.txt big2.txt | wc -l; cmp big1.txt big2.txt",
    )
    .await;
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    let count: usize = text.lines().next().unwrap().trim().parse().unwrap_or(0);
    assert!(count > 1000, "{text}");
    assert!(text.contains("big1.txt big2.txt differ: byte"), "{text}");
    assert!(text.ends_with("[exit status: 1]"), "{text}");

    let started = Instant::now();
    let text = exec(
        &registry,
        "diff -u big1.txt big2.txt > big.diff; patch -s -p0 < big.diff && cmp big1.txt big2.txt && echo equal",
    )
    .await;
    assert_eq!(
        text,
        "equal\n[exit status: 0]",
        "after {:?}",
        started.elapsed()
    );
    println!(
        "5 MB diff -u + patch + cmp through exec: {:?}",
        started.elapsed()
    );
}

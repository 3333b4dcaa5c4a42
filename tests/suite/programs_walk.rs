//! The directory walk of `grep -r` and `find` (`tools-wasm/programs/support/src/walk.rs`), which
//! reads directories and files through `wasi:filesystem` descriptors itself, run through the exec
//! tool in a real engine on real trees: GNU's order and words, and the attacks a walk meets —
//! links that loop or lead out of the workspace, a tree deeper than a path can be long, a
//! directory of thousands of entries, a file swapped for a link while the walk runs, names that
//! are not UTF-8 or hold a newline.

use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clawcage_sandbox::FsMode;
use clawcage_tests::exec_registry;
use clawcage_tests::outside::{Layout, SECRET, assert_outside_untouched, exec_text as run};

fn write(root: &Path, path: &str, text: &str) {
    let path = root.join(path);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn assert_no_secret(text: &str) {
    assert!(!text.contains(SECRET), "the secret leaked: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walks_go_depth_first_in_byte_order_with_gnu_words() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "src/b.rs", "// TODO b\n");
    write(root, "src/a/x.rs", "// TODO x\nfn x() {}\n// TODO again\n");
    write(root, "src/B.txt", "TODO upper\n");
    write(root, "src/.hidden", "TODO hidden\n");
    write(root, "src/bin.dat", "TODO\0binary\n");
    write(root, "vendor/v.rs", "// TODO vendored\n");
    fs::create_dir_all(root.join("src/empty")).unwrap();
    symlink("b.rs", root.join("src/link.rs")).unwrap();
    let registry = exec_registry(root, FsMode::ReadWrite).await;

    // Names sort by their bytes (`.` < `B` < `a` < `b`), a directory's entries right after it;
    // a link found in the walk is listed, never read or entered.
    assert_eq!(
        run(&registry, "grep -rn TODO src").await,
        "src/.hidden:1:TODO hidden\nsrc/B.txt:1:TODO upper\nsrc/a/x.rs:1:// TODO x\n\
         src/a/x.rs:3:// TODO again\nsrc/b.rs:1:// TODO b\nBinary file src/bin.dat matches\n\
         [exit status: 0]"
    );
    assert_eq!(
        run(&registry, "find src").await,
        "src\nsrc/.hidden\nsrc/B.txt\nsrc/a\nsrc/a/x.rs\nsrc/b.rs\nsrc/bin.dat\nsrc/empty\n\
         src/link.rs\n[exit status: 0]"
    );
    // Without an operand grep -r walks `.` and shows the paths without `./`; find keeps them.
    assert_eq!(
        run(&registry, "grep -rl TODO --exclude-dir=src").await,
        "vendor/v.rs\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "find . -name '*.rs' -type f").await,
        "./src/a/x.rs\n./src/b.rs\n./vendor/v.rs\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "find . -name src -prune -o -type f -print").await,
        "./vendor/v.rs\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "find src -mindepth 1 -maxdepth 1 -type d").await,
        "src/a\nsrc/empty\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "find src -type l; find src -empty").await,
        "src/link.rs\nsrc/empty\n[exit status: 0]"
    );
    // Paths resolve from the working directory, up through `..` as well.
    assert_eq!(
        run(
            &registry,
            "cd src/a && grep -rn again ../a && find .. -name x.rs"
        )
        .await,
        "../a/x.rs:3:// TODO again\n../a/x.rs\n[exit status: 0]"
    );
    // The errors and exit statuses of before.
    assert_eq!(
        run(&registry, "grep -r TODO nope; echo $?; find nope; echo $?").await,
        "grep: nope: No such file or directory\n2\n\
         find: 'nope': No such file or directory\n1\n[exit status: 0]"
    );
    // -delete empties a directory before removing it.
    assert_eq!(
        run(&registry, "find vendor -delete; echo $?; ls").await,
        "0\nsrc\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_that_loop_are_listed_once_and_never_entered() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "d/f.txt", "TODO\n");
    symlink(".", root.join("d/self")).unwrap();
    symlink("..", root.join("d/parent")).unwrap();
    symlink("loop", root.join("d/loop")).unwrap();
    symlink("d", root.join("start")).unwrap();
    let registry = exec_registry(root, FsMode::ReadWrite).await;
    let started = Instant::now();
    assert_eq!(
        run(&registry, "find d").await,
        "d\nd/f.txt\nd/loop\nd/parent\nd/self\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "grep -rc TODO .").await,
        "./d/f.txt:1\n[exit status: 0]"
    );
    // A starting path that is a link to a directory is entered (and still is a link); one that
    // loops cannot be.
    assert_eq!(
        run(&registry, "find start; find start -maxdepth 0 -type l").await,
        "start\nstart/f.txt\nstart/loop\nstart/parent\nstart/self\nstart\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "find d/loop; echo $?").await,
        "find: 'd/loop': Symbolic link loop (os error 32)\n1\n[exit status: 0]"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_out_of_the_workspace_are_never_followed() {
    let layout: Layout = clawcage_tests::outside::layout();
    let ws = &layout.workspace;
    write(ws, "d/inside.txt", "inside\n");
    symlink(&layout.parent, ws.join("out")).unwrap();
    symlink("../secret.txt", ws.join("secret-link.txt")).unwrap();
    symlink("../..", ws.join("d/up")).unwrap();
    symlink("/", ws.join("d/root")).unwrap();
    let registry = exec_registry(ws, FsMode::ReadWrite).await;
    for command in [
        "grep -r TOP .",
        "grep -r TOP",
        "grep -rl . d",
        "find . -name 'secret*'",
        "find . -type f",
        "find d -size +0",
    ] {
        let text = run(&registry, command).await;
        assert_no_secret(&text);
        assert!(!text.contains("secret.txt"), "{command}: {text}");
    }
    // As starting paths the links lead nowhere: the host refuses the way out.
    for command in [
        "grep -r TOP out",
        "grep -r TOP d/up",
        "find out/",
        "find d/up/",
    ] {
        let text = run(&registry, command).await;
        assert_no_secret(&text);
        assert!(!text.ends_with("[exit status: 0]"), "{command}: {text}");
    }
    assert_eq!(
        run(&registry, "find . -type f").await,
        "./d/inside.txt\n[exit status: 0]"
    );
    assert_outside_untouched(&layout);
}

/// Makes `levels` nested directories `d` below `base`, each holding a file `f` that says its
/// level, counted from `first`; returns the deepest directory.
fn chain(base: &Path, first: usize, levels: usize) -> std::path::PathBuf {
    let mut path = base.to_path_buf();
    for level in first..first + levels {
        path.push("d");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("f"), format!("level {level}\n")).unwrap();
    }
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_deeper_than_a_path_can_be_long_is_walked_whole() {
    // 2,100 levels of `d`, each with a file `f` after it: the deepest paths are twice as long
    // as PATH_MAX, the walk holds at most 32 directories open, and it opens again the ones it
    // gave up when it comes back to their `f`. No path that long can be made at once, so the
    // tree is made as two halves, the second then moved into the deepest directory of the first.
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    let second = dir.path().join("second");
    fs::create_dir(&workspace).unwrap();
    fs::create_dir(&second).unwrap();
    let levels = 2_100;
    let deepest_of_first = chain(&workspace, 1, levels / 2);
    chain(&second, levels / 2 + 1, levels / 2);
    fs::rename(second.join("d"), deepest_of_first.join("d")).unwrap();
    let registry = exec_registry(&workspace, FsMode::ReadWrite).await;
    let started = Instant::now();
    assert_eq!(
        run(&registry, "find d -type f | wc -l").await,
        format!("{levels}\n[exit status: 0]")
    );
    assert_eq!(
        run(
            &registry,
            "grep -rh level d | wc -l; grep -rh 'level 2100' d"
        )
        .await,
        format!("{levels}\nlevel 2100\n[exit status: 0]")
    );
    assert_eq!(
        run(&registry, "find d -type d | wc -l").await,
        format!("{levels}\n[exit status: 0]")
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_thousands_of_entries_is_listed_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let many = dir.path().join("many");
    fs::create_dir(&many).unwrap();
    for index in (0..5_000).rev() {
        fs::write(
            many.join(format!("f{index:05}")),
            format!("entry {index}\n"),
        )
        .unwrap();
    }
    let registry = exec_registry(dir.path(), FsMode::ReadWrite).await;
    assert_eq!(
        run(
            &registry,
            "find many | wc -l; find many | head -3; find many | tail -1"
        )
        .await,
        "5001\nmany\nmany/f00000\nmany/f00001\nmany/f04999\n[exit status: 0]"
    );
    assert_eq!(
        run(
            &registry,
            "grep -r entry many | wc -l; grep -rl 'entry 4321$' many"
        )
        .await,
        "5000\nmany/f04321\n[exit status: 0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_swapped_for_a_link_out_during_the_walk_is_not_followed() {
    let layout = clawcage_tests::outside::layout();
    let ws = layout.workspace.clone();
    for index in 0..200 {
        write(&ws, &format!("d/f{index:03}"), "inside\n");
    }
    let registry = exec_registry(&ws, FsMode::ReadWrite).await;
    // While the walks run, the host swaps d/f100 between a file and a link to the secret, and
    // d/sub between a directory and a link to the parent directory.
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let ws = ws.clone();
        let parent = layout.parent.clone();
        std::thread::spawn(move || {
            let target = ws.join("d/f100");
            let sub = ws.join("d/sub");
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = fs::remove_file(&target);
                let _ = symlink(parent.join("secret.txt"), &target);
                let _ = fs::remove_dir_all(&sub);
                let _ = symlink(&parent, &sub);
                std::thread::yield_now();
                let _ = fs::remove_file(&target);
                let _ = fs::write(&target, "inside\n");
                let _ = fs::remove_file(&sub);
                let _ = fs::create_dir(&sub);
                let _ = fs::write(sub.join("secret.txt"), "inside\n");
                swaps += 1;
            }
            swaps
        })
    };
    for _ in 0..15 {
        for command in [
            "grep -r TOP d",
            "grep -rc inside d | wc -l",
            "find d -size +0",
        ] {
            let text = run(&registry, command).await;
            assert_no_secret(&text);
            assert!(!text.starts_with("ERROR"), "{command}: {text}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 0);
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_are_not_utf8_or_hold_a_newline() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "names/a.txt", "TODO a\n");
    write(root, "names/new\nline.txt", "TODO newline\n");
    write(root, "names/z.txt", "TODO z\n");
    let bad = std::ffi::OsStr::from_bytes(b"b\xffd.txt");
    fs::write(root.join("names").join(bad), "TODO bad\n").unwrap();
    let registry = exec_registry(root, FsMode::ReadWrite).await;
    // WASI names are UTF-8: the host reports the one that is not as an error of its directory,
    // and the other entries are still walked.
    assert_eq!(
        run(&registry, "grep -r TODO names; echo $?").await,
        "grep: names: Illegal byte sequence (os error 25)\nnames/a.txt:TODO a\n\
         names/new\nline.txt:TODO newline\nnames/z.txt:TODO z\n2\n[exit status: 0]"
    );
    assert_eq!(
        run(
            &registry,
            "find names -print0 2>/dev/null | tr '\\0' '|'; echo"
        )
        .await,
        "names|names/a.txt|names/new\nline.txt|names/z.txt|\n[exit status: 0]"
    );
    assert_eq!(
        run(&registry, "find names -name '*line*' >/dev/null; echo $?").await,
        "find: 'names': Illegal byte sequence (os error 25)\n1\n[exit status: 0]"
    );
}

/// Each entry's type comes from the directory listing itself (the host's `read-directory` no
/// longer stats every entry): links to a file, to a directory and to nowhere, a directory and a
/// file are each found by their own `-type`, and a FIFO and a socket beside them are listed but
/// never opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_entry_is_listed_with_its_own_type() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "kinds/file", "TODO\n");
    fs::create_dir_all(root.join("kinds/dir")).unwrap();
    symlink("file", root.join("kinds/to-file")).unwrap();
    symlink("dir", root.join("kinds/to-dir")).unwrap();
    symlink("nowhere", root.join("kinds/dangling")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(root.join("kinds/fifo"))
        .status()
        .unwrap();
    assert!(made.success());
    let _socket = std::os::unix::net::UnixListener::bind(root.join("kinds/socket")).unwrap();
    let registry = exec_registry(root, FsMode::ReadWrite).await;
    for (kind, expected) in [
        ("f", "kinds/file\n"),
        ("d", "kinds\nkinds/dir\n"),
        ("l", "kinds/dangling\nkinds/to-dir\nkinds/to-file\n"),
    ] {
        assert_eq!(
            run(&registry, &format!("find kinds -type {kind}")).await,
            format!("{expected}[exit status: 0]"),
            "-type {kind}"
        );
    }
    // The walk of grep reads the file and passes the FIFO and the socket by (a read of the FIFO
    // would wait for a writer forever).
    assert_eq!(
        run(&registry, "grep -r TODO kinds").await,
        "kinds/file:TODO\n[exit status: 0]"
    );
    // `ls -F` marks each entry by the type the listing gave (a directory `/`, a link `@`; the
    // bundled ls has no mark for a FIFO or a socket inside WASI).
    assert_eq!(
        run(&registry, "ls -F kinds").await,
        "dangling@\ndir/\nfifo\nfile\nsocket\nto-dir@\nto-file@\n[exit status: 0]"
    );
}

//! tar, gzip, gunzip and zcat through the exec tool, in the real engine on real files: round
//! trips, archives made by the system's own tar and gzip, exact exit statuses, and attacks.
//! Malicious archives are built here from raw tar headers: members that climb out with `..`,
//! absolute names, symbolic and hard links leading outside, a link followed by a member below
//! it; gzip bombs against the write limit and memory limit; damaged archives. Each workspace
//! sits next to a secret file in the same parent directory, and the parent is checked to hold
//! nothing new afterwards.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clawcage_agent::ToolRegistry;
use clawcage_sandbox::components::bundled;
use clawcage_sandbox::{ExecGrant, FsMode, Limits};
use clawcage_tests::outside::{assert_outside_untouched, exec_text as run, layout};
use clawcage_tests::{exec_registry, exec_registry_with};

/// Every file, directory and link below `root` (relative paths), with a file's bytes or a
/// link's target.
fn tree(root: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let relative = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                let target = fs::read_link(&path).unwrap();
                found.push((relative, format!("-> {}", target.display())));
            } else if kind.is_dir() {
                found.push((relative, "dir".to_string()));
                stack.push(path);
            } else {
                let bytes = fs::read(&path).unwrap();
                found.push((relative, String::from_utf8_lossy(&bytes).into_owned()));
            }
        }
    }
    found.sort();
    found
}

/// A small project: nested directories, a relative symbolic link, a name longer than a tar
/// header holds, bytes that are not text.
fn make_project(root: &Path) {
    let long_dir = root.join("d".repeat(60)).join("e".repeat(60));
    fs::create_dir_all(root.join("src/nested")).unwrap();
    fs::create_dir_all(&long_dir).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("README"), "read me\n").unwrap();
    fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(
        root.join("src/nested/data.bin"),
        [0u8, 1, 2, 255, 254, 10, 0],
    )
    .unwrap();
    fs::write(long_dir.join("deep.txt"), "a long way down\n").unwrap();
    std::os::unix::fs::symlink("../README", root.join("src/readme-link")).unwrap();
}

/// Runs a system tool with `input` on standard input; its standard output.
fn system_tool(program: &str, args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("running the system's {program}: {error}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(output.status.success(), "{program} {args:?} failed");
    output.stdout
}

/// `data` gzipped by the system's gzip.
fn gzip(data: &[u8]) -> Vec<u8> {
    system_tool("gzip", &["-c"], data)
}

/// A ustar header block for a member, built by hand so that any name can be written.
fn header(name: &str, kind: u8, size: u64, link: &str) -> [u8; 512] {
    fn put(block: &mut [u8; 512], at: usize, text: &str) {
        block[at..at + text.len()].copy_from_slice(text.as_bytes());
    }
    assert!(name.len() <= 100 && link.len() <= 100);
    let mut block = [0u8; 512];
    put(&mut block, 0, name);
    put(&mut block, 100, "0000644\0");
    put(&mut block, 108, "0001750\0");
    put(&mut block, 116, "0001750\0");
    put(&mut block, 124, &format!("{size:011o}\0"));
    put(&mut block, 136, &format!("{:011o}\0", 1_700_000_000u64));
    block[156] = kind;
    put(&mut block, 157, link);
    put(&mut block, 257, "ustar\0");
    put(&mut block, 263, "00");
    block[148..156].fill(b' ');
    let sum: u32 = block.iter().map(|&byte| u32::from(byte)).sum();
    put(&mut block, 148, &format!("{sum:06o}\0 "));
    block
}

/// A member for `tar_of`: name, type flag, contents, link target.
type Member<'a> = (&'a str, u8, &'a [u8], &'a str);

/// A tar archive of `members`, with its end-of-archive blocks.
fn tar_of(members: &[Member<'_>]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (name, kind, data, link) in members {
        bytes.extend_from_slice(&header(name, *kind, data.len() as u64, link));
        bytes.extend_from_slice(data);
        bytes.resize(bytes.len().div_ceil(512) * 512, 0);
    }
    bytes.extend_from_slice(&[0u8; 1024]);
    bytes
}

/// One gzip member holding 1 MiB of zeros, repeated: `mebibytes` of zeros as a few hundred
/// bytes per MiB (gzip data may have many members, and every reader takes them as one).
fn zeros_gzipped(mebibytes: usize) -> Vec<u8> {
    let member = gzip(&vec![0u8; 1 << 20]);
    member.repeat(mebibytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_round_trips_through_tar_gz() {
    let layout = layout();
    let ws = &layout.workspace;
    make_project(&ws.join("project"));
    let registry = exec_registry(ws, FsMode::ReadWrite).await;

    let text = run(&registry, "tar czf p.tgz project && echo created").await;
    assert_eq!(text, "created\n[exit status: 0]");
    // The system's tar reads what ours wrote, long name and link included.
    let listing = system_tool("tar", &["-tzvf", "-"], &fs::read(ws.join("p.tgz")).unwrap());
    let listing = String::from_utf8(listing).unwrap();
    assert!(
        listing.contains("project/src/readme-link -> ../README"),
        "{listing}"
    );
    assert!(
        listing.contains(&format!("{}/deep.txt", "e".repeat(60))),
        "{listing}"
    );

    let text = run(&registry, "tar -tzf p.tgz | sort").await;
    let mut expected = vec![
        "project/".to_string(),
        "project/README".into(),
        format!("project/{}/", "d".repeat(60)),
        format!("project/{}/{}/", "d".repeat(60), "e".repeat(60)),
        format!("project/{}/{}/deep.txt", "d".repeat(60), "e".repeat(60)),
        "project/empty/".into(),
        "project/src/".into(),
        "project/src/main.rs".into(),
        "project/src/nested/".into(),
        "project/src/nested/data.bin".into(),
        "project/src/readme-link".into(),
    ];
    expected.sort();
    assert_eq!(text, format!("{}\n[exit status: 0]", expected.join("\n")));

    let text = run(&registry, "tar -tvzf p.tgz project/src/readme-link").await;
    assert!(
        text.starts_with("lrwxrwxrwx 0/0 ")
            && text.contains(" project/src/readme-link -> ../README\n"),
        "{text}"
    );

    let text = run(&registry, "mkdir out && tar -xzvf p.tgz -C out | wc -l").await;
    assert_eq!(text, "11\n[exit status: 0]");
    assert_eq!(tree(&ws.join("project")), tree(&ws.join("out/project")));

    // Old-style letters, a member selection and --strip-components.
    let text = run(
        &registry,
        "mkdir part && tar xzfC p.tgz part --strip-components=1 project/src && ls -R part",
    )
    .await;
    assert!(text.ends_with("[exit status: 0]"), "{text}");
    assert_eq!(tree(&ws.join("project/src")), tree(&ws.join("part/src")));
    assert!(!ws.join("part/README").exists() && !ws.join("part/project").exists());

    // -O writes a member's contents to standard output, -C when creating, plain tar to a pipe.
    let text = run(&registry, "tar -xzOf p.tgz project/README").await;
    assert_eq!(text, "read me\n[exit status: 0]");
    let text = run(
        &registry,
        "tar -cf - -C project src | tar -tf - | head -n 2",
    )
    .await;
    assert_eq!(text, "src/\nsrc/main.rs\n[exit status: 0]");
    // The archive is not put inside itself.
    let text = run(
        &registry,
        "cd project && tar -czf self.tgz . ; echo $?; tar -tzf self.tgz | grep -c self",
    )
    .await;
    assert!(
        text.contains("self.tgz: file is the archive; not dumped"),
        "{text}"
    );
    assert!(text.ends_with("0\n0\n[exit status: 1]"), "{text}");
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archives_made_by_the_system_tar_extract() {
    let layout = layout();
    let ws = &layout.workspace;
    let source = tempfile::tempdir().unwrap();
    make_project(&source.path().join("made"));
    for (file, flags) in [("host.tgz", "-czf"), ("host.tar", "-cf")] {
        let status = Command::new("tar")
            .args(["--format=gnu", flags])
            .arg(ws.join(file))
            .arg("-C")
            .arg(source.path())
            .arg("made")
            .status()
            .expect("the system's tar runs");
        assert!(status.success());
    }
    // A POSIX (pax) archive too, with a name past ustar's 255 bytes.
    let very_long = "n".repeat(200);
    fs::write(source.path().join("made").join(&very_long), "pax\n").unwrap();
    let status = Command::new("tar")
        .args(["--format=posix", "-cf"])
        .arg(ws.join("pax.tar"))
        .arg("-C")
        .arg(source.path())
        .arg("made")
        .status()
        .unwrap();
    assert!(status.success());

    let registry = exec_registry(ws, FsMode::ReadWrite).await;
    let text = run(
        &registry,
        "mkdir a b c && tar -xzf host.tgz -C a && tar -xf host.tar -C b && tar xf pax.tar -C c && echo ok",
    )
    .await;
    assert_eq!(text, "ok\n[exit status: 0]");
    fs::remove_file(source.path().join("made").join(&very_long)).unwrap();
    let original = tree(&source.path().join("made"));
    assert_eq!(tree(&ws.join("a/made")), original);
    assert_eq!(tree(&ws.join("b/made")), original);
    assert_eq!(
        fs::read_to_string(ws.join("c/made").join(&very_long)).unwrap(),
        "pax\n"
    );
    // Modification times are restored.
    let modified = |path: PathBuf| fs::metadata(path).unwrap().modified().unwrap();
    let original_time = modified(source.path().join("made/src/main.rs"));
    let extracted_time = modified(ws.join("a/made/src/main.rs"));
    let apart = original_time
        .duration_since(extracted_time)
        .unwrap_or_else(|error| error.duration());
    assert!(apart < Duration::from_secs(1), "times differ by {apart:?}");
    // gzip is detected without -z, also from a pipe.
    let text = run(&registry, "cat host.tgz | tar -tf - made/README").await;
    assert_eq!(text, "made/README\n[exit status: 0]");
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_gunzip_and_zcat_round_trip() {
    let layout = layout();
    let ws = &layout.workspace;
    let text: String = (1..=20_000).map(|n| format!("line {n}\n")).collect();
    fs::write(ws.join("f.txt"), &text).unwrap();
    fs::write(
        ws.join("host.gz"),
        system_tool("gzip", &["-9c"], b"from the host\n"),
    )
    .unwrap();
    let registry = exec_registry(ws, FsMode::ReadWrite).await;

    let out = run(&registry, "gzip f.txt && ls").await;
    assert_eq!(out, "f.txt.gz\nhost.gz\n[exit status: 0]");
    // The system's gzip reads ours.
    let unpacked = system_tool("gzip", &["-dc"], &fs::read(ws.join("f.txt.gz")).unwrap());
    assert_eq!(unpacked, text.as_bytes());
    let out = run(&registry, "zcat f.txt.gz | tail -n 1; zcat host.gz").await;
    assert_eq!(out, "line 20000\nfrom the host\n[exit status: 0]");
    let out = run(&registry, "gunzip f.txt.gz && ls && wc -l < f.txt").await;
    assert_eq!(out, "f.txt\nhost.gz\n20000\n[exit status: 0]");
    assert_eq!(fs::read_to_string(ws.join("f.txt")).unwrap(), text);

    // -k keeps the input, -c writes to standard output, -d decompresses, pipes work both ways.
    let out = run(
        &registry,
        "gzip -k9 f.txt && ls f.txt* && gzip -c f.txt > copy.gz && gzip -d < copy.gz | cmp - f.txt && cat f.txt | gzip | gunzip | wc -l",
    )
    .await;
    assert_eq!(out, "f.txt\nf.txt.gz\n20000\n[exit status: 0]");
    let out = run(
        &registry,
        "gunzip -c copy.gz | head -n 1; zcat copy.gz host.gz | wc -l",
    )
    .await;
    assert_eq!(out, "line 1\n20001\n[exit status: 0]");
    // zcat finds NAME.gz when given NAME.
    let out = run(&registry, "rm f.txt && zcat f.txt | wc -l").await;
    assert_eq!(out, "20000\n[exit status: 0]");
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_statuses_are_exact() {
    let layout = layout();
    let ws = &layout.workspace;
    fs::write(ws.join("plain.txt"), "not compressed\n").unwrap();
    fs::write(ws.join("good.tar"), tar_of(&[("a.txt", b'0', b"a\n", "")])).unwrap();
    fs::write(ws.join("done.gz"), gzip(b"x")).unwrap();
    let registry = exec_registry(ws, FsMode::ReadWrite).await;
    for (command, status, message) in [
        (
            "tar -xf missing.tar",
            2,
            "tar: missing.tar: Cannot open: No such file or directory",
        ),
        ("tar -tf good.tar", 0, "a.txt"),
        (
            "tar -tf good.tar nope",
            2,
            "tar: nope: Not found in archive",
        ),
        ("tar", 2, "You must specify one of"),
        (
            "tar -cf empty.tar",
            2,
            "Cowardly refusing to create an empty archive",
        ),
        (
            "tar -cf x.tar missing-file",
            2,
            "tar: missing-file: Cannot stat",
        ),
        ("tar -xjf good.tar", 2, "only gzip"),
        (
            "tar -tf plain.txt",
            2,
            "This does not look like a tar archive",
        ),
        (
            "gunzip missing.gz",
            1,
            "gunzip: missing.gz: No such file or directory",
        ),
        ("zcat plain.txt", 1, "zcat: plain.txt: not in gzip format"),
        (
            "gzip done.gz",
            2,
            "gzip: done.gz already has .gz suffix -- unchanged",
        ),
        (
            "gunzip plain.txt",
            2,
            "gunzip: plain.txt: unknown suffix -- ignored",
        ),
        ("gzip -Q plain.txt", 1, "gzip: invalid option -- 'Q'"),
        (
            "gzip -k plain.txt && gzip plain.txt",
            2,
            "plain.txt.gz already exists; not overwritten",
        ),
    ] {
        let text = run(&registry, &format!("{command}; echo \"status=$?\"")).await;
        assert!(text.contains(message), "{command}: {text}");
        assert!(
            text.contains(&format!("status={status}\n")),
            "{command}: {text}"
        );
    }
    // The exec tool reports the last command's status too.
    let text = run(&registry, "tar -xf missing.tar").await;
    assert!(text.ends_with("[exit status: 2]"), "{text}");
    assert!(
        ws.join("plain.txt").exists(),
        "a refused gzip must keep its input"
    );
    assert_outside_untouched(&layout);
}

/// Members that try to leave the extraction directory, mixed with good ones.
fn malicious_archive() -> Vec<u8> {
    tar_of(&[
        ("good1.txt", b'0', b"good one\n", ""),
        ("../evil", b'0', b"evil\n", ""),
        ("/abs/evil", b'0', b"evil\n", ""),
        ("a/../../evil", b'0', b"evil\n", ""),
        ("link", b'2', b"", "/etc"),
        ("link/passwd", b'0', b"evil\n", ""),
        ("up", b'2', b"", ".."),
        ("up/evil", b'0', b"evil\n", ""),
        ("hard", b'1', b"", "/etc/passwd"),
        ("hardup", b'1', b"", "../secret.txt"),
        // A link that stays inside, and a member written below it: refused all the same,
        // so nothing is ever written through a link.
        ("sub/", b'5', b"", ""),
        ("inside", b'2', b"", "sub"),
        ("inside/x", b'0', b"through a link\n", ""),
        // `d/l -> ..` stays inside; `m -> d/l/..` would lead out through it.
        ("d/l", b'2', b"", ".."),
        ("m", b'2', b"", "d/l/.."),
        ("dev", b'3', b"", ""),
        ("fifo", b'6', b"", ""),
        ("good2/x.txt", b'0', b"good two\n", ""),
        ("good2/rel", b'2', b"", "../good1.txt"),
        ("good2/hard", b'1', b"", "good1.txt"),
    ])
}

const REFUSED: &[&str] = &[
    "tar: ../evil: refusing to extract: the name contains '..'",
    "tar: /abs/evil: refusing to extract: the name is absolute",
    "tar: a/../../evil: refusing to extract: the name contains '..'",
    "tar: link: refusing to extract: symbolic link target '/etc' is absolute",
    "tar: link/passwd: refusing to extract: it lies below 'link'",
    "tar: up: refusing to extract: symbolic link target '..' leads outside the extraction directory",
    "tar: up/evil: refusing to extract: it lies below 'up'",
    "tar: hard: refusing to extract: hard link target '/etc/passwd' is absolute",
    "tar: hardup: refusing to extract: hard link target '../secret.txt' contains '..'",
    "tar: inside/x: refusing to extract: 'inside' is a symbolic link",
    "tar: m: refusing to extract: symbolic link target 'd/l/..' has '..' after a name",
    "tar: dev: character device not extracted",
    "tar: fifo: named pipe not extracted",
];

/// What a run over `malicious_archive` extracted into `dir`: only the good members.
fn assert_only_good_members(dir: &Path) {
    let found: Vec<String> = tree(dir).into_iter().map(|(name, _)| name).collect();
    assert_eq!(
        found,
        [
            "d",
            "d/l",
            "good1.txt",
            "good2",
            "good2/hard",
            "good2/rel",
            "good2/x.txt",
            "inside",
            "sub"
        ],
        "{:?}",
        tree(dir)
    );
    assert_eq!(
        fs::read_to_string(dir.join("good2/hard")).unwrap(),
        "good one\n"
    );
    assert_eq!(
        fs::read_to_string(dir.join("good2/rel")).unwrap(),
        "good one\n"
    );
    assert_eq!(fs::read_link(dir.join("inside")).unwrap(), Path::new("sub"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_leading_outside_are_refused_by_name() {
    let layout = layout();
    let ws = &layout.workspace;
    let archive = malicious_archive();
    fs::write(ws.join("evil.tar"), &archive).unwrap();
    fs::write(ws.join("evil.tgz"), gzip(&archive)).unwrap();
    let registry = exec_registry(ws, FsMode::ReadWrite).await;

    // In the workspace itself, where `..` is the parent holding the secret.
    let text = run(&registry, "mkdir x && cd x && tar -xvf ../evil.tar").await;
    for line in REFUSED {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    assert!(
        text.contains("good1.txt\n") && text.contains("good2/x.txt\n"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    assert!(text.ends_with("[exit status: 2]"), "{text}");
    assert_only_good_members(&ws.join("x"));

    // Gzipped, into a subdirectory with -C: `..` from there is still inside the workspace,
    // and still refused.
    let text = run(
        &registry,
        "mkdir y && tar -xzf evil.tgz -C y; echo status=$?",
    )
    .await;
    for line in REFUSED {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    assert!(text.ends_with("status=2\n[exit status: 0]"), "{text}");
    assert_only_good_members(&ws.join("y"));

    // Nothing landed in the workspace root either (`up/evil` from x, `../evil` from y).
    let mut top: Vec<String> = fs::read_dir(ws)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, ["evil.tar", "evil.tgz", "x", "y"]);
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_already_in_the_workspace_is_not_written_through() {
    let layout = layout();
    let ws = &layout.workspace;
    fs::create_dir(ws.join("real")).unwrap();
    std::os::unix::fs::symlink("real", ws.join("alias")).unwrap();
    fs::write(ws.join("target.txt"), "keep\n").unwrap();
    std::os::unix::fs::symlink("target.txt", ws.join("file-link")).unwrap();
    fs::write(
        ws.join("a.tar"),
        tar_of(&[
            ("alias/x", b'0', b"through\n", ""),
            ("file-link", b'0', b"replaced\n", ""),
        ]),
    )
    .unwrap();
    let registry = exec_registry(ws, FsMode::ReadWrite).await;
    let text = run(&registry, "tar -xf a.tar").await;
    assert!(
        text.contains("tar: alias/x: refusing to extract: 'alias' is a symbolic link"),
        "{text}"
    );
    assert!(text.ends_with("[exit status: 2]"), "{text}");
    assert!(!ws.join("real/x").exists());
    // An existing link is replaced by the member, never followed.
    assert_eq!(fs::read_to_string(ws.join("target.txt")).unwrap(), "keep\n");
    assert!(
        !fs::symlink_metadata(ws.join("file-link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        fs::read_to_string(ws.join("file-link")).unwrap(),
        "replaced\n"
    );
    assert_outside_untouched(&layout);
}

/// A registry whose exec calls may write 64 MiB (the default is 1 GiB; the mechanism is the
/// same, and a smaller one keeps the test quick).
async fn registry_with_small_write_limit(workspace: &Path) -> ToolRegistry {
    const LIMIT: u64 = 64 << 20;
    let catalog = clawcage_tests::programs().await;
    let grants = clawcage_tests::grants(workspace, FsMode::ReadWrite, Limits::default()).with_exec(
        ExecGrant {
            write_limit_bytes: LIMIT,
            ..ExecGrant::new(catalog)
        },
    );
    clawcage_tests::registry_of(&[("exec", bundled::EXEC)], grants).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_bombs_stop_at_the_write_limit() {
    let layout = layout();
    let ws = &layout.workspace;
    // 1 GiB of zeros as about 1 MiB of gzip, and a tar.gz holding it as one file.
    let zeros = zeros_gzipped(1024);
    fs::write(ws.join("bomb.gz"), &zeros).unwrap();
    let mut tar_bomb = gzip(&header("big.bin", b'0', 1 << 30, ""));
    tar_bomb.extend_from_slice(&zeros);
    tar_bomb.extend_from_slice(&zeros_gzipped(1));
    fs::write(ws.join("bomb.tgz"), &tar_bomb).unwrap();
    let registry = registry_with_small_write_limit(ws).await;

    for (command, written) in [
        ("tar -xzf bomb.tgz", "big.bin"),
        ("gunzip -k bomb.gz", "bomb"),
        ("zcat bomb.gz > out.bin", "out.bin"),
    ] {
        let started = Instant::now();
        let text = run(&registry, command).await;
        assert!(
            text.starts_with("ERROR failed") && text.contains("write limit"),
            "{command}: {text}"
        );
        let size = fs::metadata(ws.join(written)).map_or(0, |metadata| metadata.len());
        assert!(size <= (65 << 20), "{command}: {written} is {size} bytes");
        eprintln!("{command}: stopped after {:?}", started.elapsed());
        let _ = fs::remove_file(ws.join(written));
    }
    // The host keeps serving.
    assert_eq!(
        run(&registry, "echo alive").await,
        "alive\n[exit status: 0]"
    );
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bomb_to_standard_output_ends_cleanly() {
    let layout = layout();
    let ws = &layout.workspace;
    fs::write(ws.join("bomb.gz"), zeros_gzipped(1024)).unwrap();
    fs::write(ws.join("small.gz"), zeros_gzipped(32)).unwrap();
    let registry = exec_registry_with(
        ws,
        FsMode::ReadWrite,
        Limits {
            timeout: Duration::from_secs(5),
            ..Limits::default()
        },
    )
    .await;
    // 32 MiB into the tool's output: it ends, and the output keeps only a head and a tail.
    let text = run(&registry, "zcat small.gz").await;
    assert!(text.len() < 1 << 20, "{} bytes of output", text.len());
    assert!(
        text.ends_with("[exit status: 0]"),
        "{}",
        &text[text.len() - 200..]
    );
    // 1 GiB into the output or into a pipe: stopped at the call's time limit.
    for command in ["zcat bomb.gz", "zcat bomb.gz | wc -c"] {
        let started = Instant::now();
        let text = run(&registry, command).await;
        let elapsed = started.elapsed();
        eprintln!(
            "{command}: {elapsed:?}: {}",
            &text[text.len().saturating_sub(300)..]
        );
        assert!(
            text.len() < 1 << 20,
            "{command}: {} bytes of output",
            text.len()
        );
        assert!(
            elapsed < Duration::from_secs(15),
            "{command} took {elapsed:?}"
        );
        assert!(
            text.contains("time limit"),
            "{command}: {}",
            &text[text.len().saturating_sub(300)..]
        );
    }
    assert_eq!(
        run(&registry, "echo alive").await,
        "alive\n[exit status: 0]"
    );
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_long_name_hits_the_memory_limit_cleanly() {
    let layout = layout();
    let ws = &layout.workspace;
    // A GNU long-name record claiming 1 GiB: a reader that keeps it whole runs out of memory.
    let mut archive = gzip(&header("././@LongLink", b'L', 1 << 30, ""));
    archive.extend_from_slice(&zeros_gzipped(1025));
    fs::write(ws.join("longname.tgz"), &archive).unwrap();
    let registry = exec_registry(ws, FsMode::ReadWrite).await;
    let text = run(&registry, "tar -xzf longname.tgz; echo status=$?").await;
    // The sandbox stops the program at its memory limit; the shell and the host go on.
    assert!(
        text.contains("tar: stopped: it used more than its memory limit"),
        "{text}"
    );
    assert!(text.contains("status=137\n"), "{text}");
    let found: Vec<String> = fs::read_dir(ws)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(found, ["longname.tgz"], "{text}");
    assert_eq!(
        run(&registry, "echo alive").await,
        "alive\n[exit status: 0]"
    );
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_archives_fail_cleanly() {
    let layout = layout();
    let ws = &layout.workspace;
    let source = tempfile::tempdir().unwrap();
    make_project(&source.path().join("p"));
    let status = Command::new("tar")
        .arg("-czf")
        .arg(ws.join("good.tgz"))
        .arg("-C")
        .arg(source.path())
        .arg("p")
        .status()
        .unwrap();
    assert!(status.success());
    let good = fs::read(ws.join("good.tgz")).unwrap();
    fs::write(ws.join("cut.tgz"), &good[..good.len() / 2]).unwrap();
    fs::write(ws.join("tail-cut.tgz"), &good[..good.len() - 4]).unwrap();
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    for byte in &mut flipped[middle..middle + 64] {
        *byte ^= 0x5a;
    }
    fs::write(ws.join("flipped.tgz"), &flipped).unwrap();
    let garbage: Vec<u8> = (0..4096u32)
        .map(|n| (n.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(
        ws.join("garbage.tgz"),
        [&[0x1f, 0x8b][..], &garbage].concat(),
    )
    .unwrap();
    fs::write(ws.join("garbage.tar"), &garbage).unwrap();
    let plain = tar_of(&[("ok.txt", b'0', b"ok\n", "")]);
    fs::write(ws.join("short.tar"), &plain[..700]).unwrap();
    let lines: String = (0..20_000).map(|n| format!("line {n}\n")).collect();
    let lines = gzip(lines.as_bytes());
    fs::write(ws.join("cut.gz"), &lines[..lines.len() / 2]).unwrap();
    let registry = exec_registry(ws, FsMode::ReadWrite).await;

    for archive in [
        "cut.tgz",
        "tail-cut.tgz",
        "flipped.tgz",
        "garbage.tgz",
        "garbage.tar",
        "short.tar",
    ] {
        let text = run(
            &registry,
            &format!("mkdir -p out && tar -xf {archive} -C out; echo status=$?"),
        )
        .await;
        assert!(text.contains("status=2\n"), "{archive}: {text}");
        assert!(text.contains("tar: "), "{archive}: {text}");
        assert!(!text.contains("panicked"), "{archive}: {text}");
    }
    let text = run(&registry, "gunzip cut.gz; echo status=$?; ls cut*").await;
    assert!(
        text.contains("gunzip: cut.gz: unexpected end of file"),
        "{text}"
    );
    assert!(text.contains("status=1\n"), "{text}");
    // The damaged input stays, no partial output is left.
    assert!(text.contains("cut.gz\ncut.tgz\n"), "{text}");
    assert!(!ws.join("cut").exists());
    assert_outside_untouched(&layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_files_extract() {
    let layout = layout();
    let ws = &layout.workspace;
    let source = tempfile::tempdir().unwrap();
    for directory in 0..10 {
        let dir = source.path().join(format!("many/d{directory}"));
        fs::create_dir_all(&dir).unwrap();
        for file in 0..100 {
            fs::write(
                dir.join(format!("f{file}.txt")),
                format!("{directory}/{file}\n"),
            )
            .unwrap();
        }
    }
    let status = Command::new("tar")
        .arg("-czf")
        .arg(ws.join("many.tgz"))
        .arg("-C")
        .arg(source.path())
        .arg("many")
        .status()
        .unwrap();
    assert!(status.success());
    let registry = exec_registry(ws, FsMode::ReadWrite).await;
    let started = Instant::now();
    let text = run(&registry, "tar -xzf many.tgz").await;
    let elapsed = started.elapsed();
    eprintln!("tar -xzf of 1,000 files through exec: {elapsed:?}");
    assert_eq!(text, "[exit status: 0]");
    assert_eq!(tree(&ws.join("many")), tree(&source.path().join("many")));
    let started = Instant::now();
    let text = run(
        &registry,
        "tar -czf again.tgz many && tar -tzf again.tgz | wc -l",
    )
    .await;
    eprintln!(
        "tar -czf and -tzf of 1,000 files through exec: {:?}",
        started.elapsed()
    );
    assert_eq!(text, "1011\n[exit status: 0]");
    assert_outside_untouched(&layout);
}

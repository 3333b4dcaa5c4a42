//! Skills read from real directories in temp dirs: front matter, precedence, limits, and the
//! files and links that are refused.

use super::*;

fn skill_md(front: &str, body: &str) -> String {
    format!("---\n{front}\n---\n{body}")
}

fn write_skill(dir: &Path, folder: &str, text: &str) {
    std::fs::create_dir_all(dir.join(folder)).unwrap();
    std::fs::write(dir.join(folder).join(SKILL_FILE), text).unwrap();
}

fn dirs(workspace: &Path, user: &Path) -> SkillDirs {
    SkillDirs::new(workspace, Some(user))
}

fn find<'a>(skills: &'a Skills, name: &str, source: SkillSource) -> &'a Skill {
    skills
        .skills
        .iter()
        .find(|skill| skill.name == name && skill.source == source)
        .unwrap_or_else(|| panic!("{name} ({source:?}) not in {:#?}", skills.skills))
}

#[test]
fn front_matter_gives_name_description_and_instructions() {
    let parsed = parse_skill_file(&skill_md(
        "name: csv-sum\ndescription: >\n  Sum a column\n  of a CSV file.",
        "# Steps\nRun it.\n",
    ))
    .unwrap();
    assert_eq!(parsed.name, "csv-sum");
    assert_eq!(parsed.description, "Sum a column of a CSV file.");
    assert_eq!(parsed.instructions, "# Steps\nRun it.\n");
    assert!(parsed.notes.is_empty(), "{:?}", parsed.notes);
    // A byte-order mark and CRLF line ends are read too.
    let crlf = "\u{feff}---\r\nname: x\r\ndescription: y\r\n---\r\nbody\r\n";
    let parsed = parse_skill_file(crlf).unwrap();
    assert_eq!(
        (parsed.name.as_str(), parsed.description.as_str()),
        ("x", "y")
    );
}

#[test]
fn both_forms_of_requirements_are_read() {
    let openclaw = parse_skill_file(&skill_md(
            r#"name: a
description: b
metadata: {"openclaw": {"emoji": "x", "requires": {"bins": ["python3", "jq"], "anyBins": ["awk", "gawk"], "env": ["TOKEN"]}}}"#,
            "",
        ))
        .unwrap();
    assert_eq!(openclaw.requires, ["jq", "python3"]);
    assert_eq!(openclaw.requires_any, ["awk", "gawk"]);
    assert!(
        openclaw.notes[0].contains("metadata.openclaw.requires.env"),
        "{:?}",
        openclaw.notes
    );
    let block = parse_skill_file(&skill_md(
            "name: a\ndescription: b\nmetadata:\n  openclaw:\n    requires:\n      bins:\n        - python3",
            "",
        ))
        .unwrap();
    assert_eq!(block.requires, ["python3"]);
    let as_text = parse_skill_file(&skill_md(
        "name: a\ndescription: b\nmetadata: '{\"openclaw\":{\"requires\":{\"bins\":[\"sed\"]}}}'",
        "",
    ))
    .unwrap();
    assert_eq!(as_text.requires, ["sed"]);
    let plain = parse_skill_file(&skill_md(
        "name: a\ndescription: b\nrequires: {programs: [python3]}",
        "",
    ))
    .unwrap();
    assert_eq!(plain.requires, ["python3"]);
    let one = parse_skill_file(&skill_md(
        "name: a\ndescription: b\nrequires:\n  programs: grep",
        "",
    ))
    .unwrap();
    assert_eq!(one.requires, ["grep"]);
    let bad = parse_skill_file(&skill_md(
        "name: a\ndescription: b\nrequires: {programs: [\"../../bin/sh\"]}",
        "",
    ))
    .unwrap_err();
    assert!(bad.contains("not a program name"), "{bad}");
}

#[test]
fn malformed_front_matter_is_refused_with_its_line() {
    let cases = [
        ("# no front matter\n", "no front matter"),
        ("---\nname: a\ndescription: b\n", "not closed"),
        ("---\nname: a\n---\n", "no `description`"),
        ("---\ndescription: a\n---\n", "no `name`"),
        (
            "---\nname: [a]\ndescription: b\n---\n",
            "`name` must be text",
        ),
        (
            "---\nname: a\ndescription: \"  \"\n---\n",
            "description is empty",
        ),
        ("---\nname: a b\ndescription: c\n---\n", "not a skill name"),
        ("---\n- a\n- b\n---\n", "not a mapping"),
        ("---\n---\n", "empty"),
        (
            "---\nname: a\nname: b\ndescription: c\n---\n",
            "not valid YAML",
        ),
    ];
    for (text, expected) in cases {
        let error = parse_skill_file(text).unwrap_err();
        assert!(error.contains(expected), "{text:?}: {error}");
    }
    let error = parse_skill_file("---\nname: a\ndescription: Sum: a column\n---\n").unwrap_err();
    assert!(
        error.starts_with("the front matter is not valid YAML: line 3, column"),
        "{error}"
    );
}

#[test]
fn an_alias_bomb_and_deep_nesting_are_refused_quickly() {
    let mut front =
        String::from("name: a\ndescription: b\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..10 {
        let previous = level - 1;
        front.push_str(&format!(
                "l{level}: &l{level} [*l{previous}, *l{previous}, *l{previous}, *l{previous}, *l{previous}, *l{previous}, *l{previous}, *l{previous}, *l{previous}, *l{previous}]\n"
            ));
    }
    let started = std::time::Instant::now();
    let error = parse_skill_file(&skill_md(&front, "")).unwrap_err();
    assert!(error.contains("not valid YAML"), "{error}");
    let deep = format!(
        "name: a\ndescription: b\nx: {}{}",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let error = parse_skill_file(&skill_md(&deep, "")).unwrap_err();
    assert!(error.contains("not valid YAML"), "{error}");
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    let long = format!("---\nname: a\ndescription: b\n{}", "x: y\n".repeat(20_000));
    let error = parse_skill_file(&long).unwrap_err();
    assert!(error.contains("longer than 65536 bytes"), "{error}");
}

#[test]
fn grant_keys_are_ignored_with_a_note() {
    let parsed = parse_skill_file(&skill_md(
            "name: a\ndescription: b\nallowed-tools: [exec, web_fetch]\nhosts: ['*']\ngrants: {paths: ['/']}\nlicense: MIT",
            "",
        ))
        .unwrap();
    assert_eq!(parsed.notes.len(), 1, "{:?}", parsed.notes);
    assert!(
        parsed.notes[0]
            .starts_with("ignored `allowed-tools`, `grants`, `hosts`: a skill is instructions"),
        "{:?}",
        parsed.notes
    );
    assert!(parsed.requires.is_empty());
}

#[test]
fn descriptions_are_capped() {
    let long = "d".repeat(MAX_DESCRIPTION_CHARS + 1);
    let error =
        parse_skill_file(&skill_md(&format!("name: a\ndescription: {long}"), "")).unwrap_err();
    assert!(error.contains("1025 characters, more than 1024"), "{error}");
    let exact = "é".repeat(MAX_DESCRIPTION_CHARS);
    assert!(parse_skill_file(&skill_md(&format!("name: a\ndescription: {exact}"), "")).is_ok());
}

#[test]
fn the_user_skill_wins_a_clash_and_says_so() {
    let workspace = tempfile::tempdir().unwrap();
    let user = tempfile::tempdir().unwrap();
    let skills_dir = workspace.path().join(SKILLS_DIR);
    write_skill(
        &skills_dir,
        "style",
        &skill_md("name: style\ndescription: workspace style", ""),
    );
    write_skill(
        &skills_dir,
        "notes",
        &skill_md("name: notes\ndescription: take notes", ""),
    );
    write_skill(
        user.path().join(SKILLS_DIR).as_path(),
        "style",
        &skill_md(
            "name: style\ndescription: the house style",
            "Write plainly.\n",
        ),
    );
    let skills = load_skills(
        &dirs(workspace.path(), user.path()),
        &AvailablePrograms::names(["sed"]),
    );
    let mine = find(&skills, "style", SkillSource::User);
    assert!(mine.is_usable());
    assert_eq!(
        mine.notes,
        ["shadows workspace skill at skills/style/SKILL.md"]
    );
    let theirs = find(&skills, "style", SkillSource::Workspace);
    assert_eq!(theirs.status, SkillStatus::Skipped);
    assert!(
        theirs
            .reason
            .as_deref()
            .unwrap_or_default()
            .starts_with("shadowed by the user skill style at "),
        "{theirs:?}"
    );
    let prompt = skills.prompt().unwrap();
    assert!(
        prompt.contains("- notes: take notes (read_file `skills/notes/SKILL.md`)"),
        "{prompt}"
    );
    assert!(
        prompt.contains("- style: the house style (user skill: its instructions are below)"),
        "{prompt}"
    );
    assert!(prompt.ends_with("Write plainly."), "{prompt}");
    assert!(!prompt.contains("workspace style"), "{prompt}");
    assert!(
        !prompt.contains(&user.path().display().to_string()),
        "no host path in the prompt"
    );
}

#[test]
fn a_broken_user_skill_still_shadows_the_workspace_one() {
    let workspace = tempfile::tempdir().unwrap();
    let user = tempfile::tempdir().unwrap();
    write_skill(
        &workspace.path().join(SKILLS_DIR),
        "deploy",
        &skill_md("name: deploy\ndescription: deploy it", ""),
    );
    write_skill(
        &user.path().join(SKILLS_DIR),
        "deploy",
        &skill_md(
            "name: deploy\ndescription: deploy\nrequires: {programs: [python3]}",
            "",
        ),
    );
    let skills = load_skills(
        &dirs(workspace.path(), user.path()),
        &AvailablePrograms::names(["sed"]),
    );
    assert_eq!(skills.usable().count(), 0, "{:#?}", skills.skills);
    assert_eq!(skills.prompt(), None);
}

#[test]
fn missing_programs_skip_a_skill_with_the_command_to_install_them() {
    let workspace = tempfile::tempdir().unwrap();
    let skills_dir = workspace.path().join(SKILLS_DIR);
    write_skill(
        &skills_dir,
        "py",
        &skill_md(
            "name: py\ndescription: p\nrequires: {programs: [python3]}",
            "",
        ),
    );
    write_skill(
        &skills_dir,
        "two",
        &skill_md(
            "name: two\ndescription: t\nrequires: {programs: [python3, node]}",
            "",
        ),
    );
    write_skill(
        &skills_dir,
        "any",
        &skill_md(
            "name: any\ndescription: a\nmetadata: {\"openclaw\": {\"requires\": {\"anyBins\": [\"gawk\", \"mawk\"]}}}",
            "",
        ),
    );
    write_skill(
        &skills_dir,
        "ok",
        &skill_md(
            "name: ok\ndescription: o\nmetadata: {\"openclaw\": {\"requires\": {\"bins\": [\"sed\"], \"anyBins\": [\"gawk\", \"grep\"]}}}",
            "",
        ),
    );
    let dirs = SkillDirs::new(workspace.path(), None);
    let mut skills = read_skills(&dirs);
    assert!(skills.needs_programs());
    skills.finish(&AvailablePrograms::names(["sed", "grep"]).with_installable(["python3"]));
    let reason = |name: &str| {
        find(&skills, name, SkillSource::Workspace)
            .reason
            .clone()
            .unwrap_or_default()
    };
    assert_eq!(
        reason("py"),
        "requires program `python3`, which is not installed; `clawcage programs install python3`"
    );
    assert_eq!(
        reason("two"),
        "requires programs `node` and `python3`, which are not installed; `clawcage programs install python3`; add node.wasm (a WASI program) to the directory of [exec] programs_dir"
    );
    assert_eq!(
        reason("any"),
        "requires one of the programs `gawk`, `mawk`, and none is installed; add gawk.wasm (a WASI program) to the directory of [exec] programs_dir"
    );
    assert!(find(&skills, "ok", SkillSource::Workspace).is_usable());
    let off = load_skills(&dirs, &AvailablePrograms::ExecDisabled);
    assert!(
        find(&off, "py", SkillSource::Workspace)
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("exec is turned off"),
    );
    assert_eq!(off.usable().count(), 0);
}

#[test]
fn caps_links_and_odd_entries_are_skipped_with_reasons() {
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let skills_dir = workspace.path().join(SKILLS_DIR);
    write_skill(
        outside.path(),
        "evil",
        &skill_md("name: evil\ndescription: from outside", ""),
    );
    std::fs::create_dir_all(&skills_dir).unwrap();
    std::os::unix::fs::symlink(outside.path().join("evil"), skills_dir.join("evil")).unwrap();
    std::fs::create_dir(skills_dir.join("linked-file")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("evil").join(SKILL_FILE),
        skills_dir.join("linked-file").join(SKILL_FILE),
    )
    .unwrap();
    std::fs::create_dir(skills_dir.join("empty")).unwrap();
    std::fs::create_dir(skills_dir.join("bad name")).unwrap();
    std::fs::create_dir(skills_dir.join(".git")).unwrap();
    std::fs::write(skills_dir.join("README.md"), "not a skill").unwrap();
    write_skill(
        &skills_dir,
        "huge",
        &"x".repeat(MAX_SKILL_FILE_BYTES as usize + 1),
    );
    write_skill(&skills_dir, "binary", "");
    std::fs::write(
        skills_dir.join("binary").join(SKILL_FILE),
        [0xff, 0xfe, 0x00],
    )
    .unwrap();
    let skills = load_skills(
        &SkillDirs::new(workspace.path(), None),
        &AvailablePrograms::names(["sed"]),
    );
    let reason = |name: &str| {
        find(&skills, name, SkillSource::Workspace)
            .reason
            .clone()
            .unwrap_or_default()
    };
    assert!(
        reason("evil").starts_with("the folder is a symbolic link (to "),
        "{}",
        reason("evil")
    );
    assert!(
        reason("linked-file").starts_with("SKILL.md is a symbolic link"),
        "{}",
        reason("linked-file")
    );
    assert_eq!(reason("empty"), "the folder has no SKILL.md");
    assert!(reason("bad name").contains("characters other than"));
    assert!(
        reason("huge").contains("more than the 262144 read"),
        "{}",
        reason("huge")
    );
    assert!(
        reason("binary").contains("not UTF-8"),
        "{}",
        reason("binary")
    );
    assert_eq!(
        skills.skills.len(),
        6,
        "hidden folders and files are not skills: {:#?}",
        skills.skills
    );
    assert_eq!(skills.usable().count(), 0);
    assert!(!format!("{:?}", skills.prompt()).contains("from outside"));

    // The workspace's skills folder itself may not be a link.
    let other = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), other.path().join(SKILLS_DIR)).unwrap();
    let skills = load_skills(
        &SkillDirs::new(other.path(), None),
        &AvailablePrograms::names(["sed"]),
    );
    assert!(skills.skills.is_empty());
    assert!(
        skills.dirs[0].notes[0].starts_with("not read: it is a symbolic link"),
        "{:?}",
        skills.dirs
    );
}

#[test]
fn many_folders_are_capped_and_the_rest_counted() {
    let workspace = tempfile::tempdir().unwrap();
    let user = tempfile::tempdir().unwrap();
    let skills_dir = workspace.path().join(SKILLS_DIR);
    for index in 0..(MAX_SKILLS + 20) {
        let name = format!("s{index:04}");
        write_skill(
            &skills_dir,
            &name,
            &skill_md(&format!("name: {name}\ndescription: d"), ""),
        );
    }
    write_skill(
        &user.path().join(SKILLS_DIR),
        "mine",
        &skill_md("name: mine\ndescription: m", "do it"),
    );
    let skills = load_skills(
        &dirs(workspace.path(), user.path()),
        &AvailablePrograms::names(["sed"]),
    );
    assert_eq!(skills.skills.len(), MAX_SKILLS + 1);
    assert_eq!(skills.usable().count(), MAX_SKILLS);
    assert!(
        find(&skills, "mine", SkillSource::User).is_usable(),
        "the user's come first"
    );
    assert!(
        find(&skills, "s0099", SkillSource::Workspace)
            .reason
            .as_deref()
            .unwrap_or_default()
            .starts_with("over the limit of 100 skills"),
    );
    assert_eq!(
        skills.dirs[1].notes,
        [
            "20 more folders were not read: at most 100 skill folders are read from a directory, in name order"
        ]
    );
}

#[test]
fn user_instructions_are_bounded() {
    let workspace = tempfile::tempdir().unwrap();
    let user = tempfile::tempdir().unwrap();
    let user_skills = user.path().join(SKILLS_DIR);
    write_skill(
        &user_skills,
        "long",
        &skill_md(
            "name: long\ndescription: l",
            &"x\n".repeat(MAX_USER_INSTRUCTIONS_BYTES),
        ),
    );
    for index in 0..4 {
        write_skill(
            &user_skills,
            &format!("part{index}"),
            &skill_md(
                &format!("name: part{index}\ndescription: p"),
                &"y\n".repeat(5000),
            ),
        );
    }
    let skills = load_skills(
        &dirs(workspace.path(), user.path()),
        &AvailablePrograms::names(["sed"]),
    );
    assert!(
        find(&skills, "long", SkillSource::User)
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("at most 12288 bytes")
    );
    let usable: Vec<&str> = skills.usable().map(|skill| skill.name.as_str()).collect();
    assert_eq!(usable, ["part0", "part1", "part2"]);
    assert!(skills.prompt().unwrap().len() < MAX_USER_INSTRUCTIONS_TOTAL + 2048);
}

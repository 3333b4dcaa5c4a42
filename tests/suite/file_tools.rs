//! The file tools' happy paths through the registry: real component, real engine, real files.

use std::fs;

use clawcage_sandbox::FsMode;
use clawcage_tests::file_registry;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_dir_marks_folders_and_files() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("src")).unwrap();
    fs::write(dir.path().join("README.md"), "hi").unwrap();
    let registry = file_registry(dir.path(), FsMode::ReadWrite).await;

    let listing = registry.execute("list_dir", "{}").await.unwrap().text;
    assert!(listing.contains("[folder] src"), "{listing}");
    assert!(listing.contains("[file] README.md"), "{listing}");

    let empty = registry
        .execute("list_dir", r#"{"path": "src"}"#)
        .await
        .unwrap()
        .text;
    assert!(empty.to_lowercase().contains("empty"), "{empty}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_file_creates_parents_and_read_file_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let registry = file_registry(dir.path(), FsMode::ReadWrite).await;

    let args = json!({"path": "notes/deep/a.txt", "content": "one\ntwo\nthree\n"});
    let written = registry
        .execute_value("write_file", &args)
        .await
        .unwrap()
        .text;
    assert!(written.contains("notes/deep/a.txt"), "{written}");
    assert_eq!(
        fs::read_to_string(dir.path().join("notes/deep/a.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );

    let read = registry
        .execute("read_file", r#"{"path": "notes/deep/a.txt"}"#)
        .await
        .unwrap()
        .text;
    assert_eq!(read.trim_end(), "one\ntwo\nthree");

    // No temporary file is left beside the target.
    let names: Vec<_> = fs::read_dir(dir.path().join("notes/deep"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["a.txt"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_pages_with_offset_and_limit_and_says_when_cut() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
    fs::write(dir.path().join("long.txt"), text).unwrap();
    let registry = file_registry(dir.path(), FsMode::ReadOnly).await;

    let page = registry
        .execute(
            "read_file",
            r#"{"path": "long.txt", "offset": 10, "limit": 3}"#,
        )
        .await
        .unwrap()
        .text;
    assert!(page.starts_with("line 10\nline 11\nline 12\n"), "{page}");
    assert!(!page.contains("line 13\n"), "{page}");
    assert!(
        page.contains("offset=13"),
        "the cut note says how to continue: {page}"
    );

    let whole = registry
        .execute("read_file", r#"{"path": "long.txt"}"#)
        .await
        .unwrap()
        .text;
    assert!(whole.contains("line 100"));
    assert!(
        !whole.contains("cut"),
        "a whole file has no cut note: {whole}"
    );

    let past_end = registry
        .execute("read_file", r#"{"path": "long.txt", "offset": 500}"#)
        .await
        .unwrap_err();
    assert!(past_end.message().contains("100"), "{past_end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_file_replaces_exactly_one_match() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("code.rs");
    fs::write(&path, "fn a() {}\nfn b() {}\nfn b() {}\n").unwrap();
    let registry = file_registry(dir.path(), FsMode::ReadWrite).await;

    let args = json!({"path": "code.rs", "old_text": "fn a() {}", "new_text": "fn alpha() {}"});
    registry.execute_value("edit_file", &args).await.unwrap();
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "fn alpha() {}\nfn b() {}\nfn b() {}\n"
    );

    let missing = json!({"path": "code.rs", "old_text": "fn zeta() {}", "new_text": "x"});
    let error = registry
        .execute_value("edit_file", &missing)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "failed");
    assert!(
        error.message().contains("code.rs"),
        "the error names the file: {error}"
    );

    let several = json!({"path": "code.rs", "old_text": "fn b() {}", "new_text": "fn beta() {}"});
    // Nothing changed, so the call failed; the model still learns the count.
    let failure = registry
        .execute_value("edit_file", &several)
        .await
        .unwrap_err();
    assert_eq!(failure.kind(), "failed", "{failure}");
    let warning = failure.message();
    assert!(
        warning.contains("occurs 2 times"),
        "the failure states the count: {warning}"
    );
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "fn alpha() {}\nfn b() {}\nfn b() {}\n",
        "several matches change nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_path_inside_the_workspace_names_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.txt"), "absolute works").unwrap();
    let registry = file_registry(dir.path(), FsMode::ReadOnly).await;
    let absolute = dir.path().canonicalize().unwrap().join("a.txt");
    let args = json!({"path": absolute.to_str().unwrap()});
    let text = registry
        .execute_value("read_file", &args)
        .await
        .unwrap()
        .text;
    assert!(text.contains("absolute works"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_definitions_carry_the_component_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let registry = file_registry(dir.path(), FsMode::ReadWrite).await;
    assert_eq!(
        registry.names(),
        vec!["edit_file", "list_dir", "read_file", "write_file"]
    );
    for definition in registry.anthropic_definitions() {
        assert_eq!(definition["input_schema"]["type"], "object", "{definition}");
        assert!(
            definition["description"].as_str().unwrap().len() > 40,
            "{definition}"
        );
    }
    let read = registry
        .openai_definitions()
        .into_iter()
        .find(|definition| definition["function"]["name"] == "read_file")
        .unwrap();
    assert_eq!(read["function"]["parameters"]["required"], json!(["path"]));
}

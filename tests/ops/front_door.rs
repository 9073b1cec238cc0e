//! The README's `[dependencies]` snippet names this package and features it really has, so a
//! user who copies it gets this crate, not the unrelated one that owns the name `ordo`.

use std::collections::HashSet;

const README: &str = include_str!("../../README.md");
const MANIFEST: &str = include_str!("../../Cargo.toml");

/// The `name = "…"` of the manifest's `[package]` table.
fn package_name() -> String {
    let package = MANIFEST
        .split("\n[")
        .find(|table| table.starts_with("[package]") || table.starts_with("package]"))
        .expect("a [package] table");
    package
        .lines()
        .find_map(|line| line.strip_prefix("name = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("a package name")
        .to_owned()
}

/// The keys of the manifest's `[features]` table.
fn features() -> HashSet<String> {
    let table = MANIFEST
        .split("\n[")
        .find(|table| table.starts_with("features]"))
        .expect("a [features] table");
    table
        .lines()
        .skip(1)
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| line.split_once(" = ").map(|(key, _)| key.trim().to_owned()))
        .collect()
}

/// The README's dependency line for this package: its name and the features it enables.
fn readme_dependency() -> (String, Vec<String>) {
    let block = README
        .split("```toml")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a ```toml block in the README");
    let line = block
        .lines()
        .find(|line| line.contains("version") && !line.trim_start().starts_with("tokio"))
        .and_then(|_| block.lines().find(|line| line.starts_with("ordo")))
        .expect("a dependency line for ordo in the README's toml block");
    let name = line.split_whitespace().next().expect("a name").to_owned();
    let features = line
        .split_once("features = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| {
            list.split(',')
                .map(|f| f.trim().trim_matches('"').to_owned())
                .filter(|f| !f.is_empty())
                .collect()
        })
        .unwrap_or_default();
    (name, features)
}

#[test]
fn the_readme_dependency_snippet_names_this_package_and_its_features() {
    let (name, wanted) = readme_dependency();
    assert_eq!(
        name,
        package_name(),
        "the README tells users to depend on another package"
    );
    assert_ne!(name, "ordo", "`ordo` on the registry is an unrelated crate");
    let features = features();
    for feature in wanted {
        assert!(
            features.contains(&feature),
            "the README enables feature {feature:?}, which Cargo.toml does not have"
        );
    }
}

#[test]
fn the_library_is_ordo_in_code_and_reexports_its_sqlx() {
    // Compiles only if the library's name is `ordo` and `ordo::sqlx` is the sqlx it uses.
    fn takes_pool(_: &ordo::sqlx::PgPool) {}
    let _ = takes_pool;
}

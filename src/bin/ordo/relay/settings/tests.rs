use super::*;

#[test]
fn a_file_sets_what_its_lines_name_and_the_flags_win() {
    let file = parse_file(
        "# billing\nname = billing-to-nats\nsink = nats\n\nbatch-deadline = \"2s\"\n\
         key-from = payload:/customer\nsubject-prefix = billing\n",
    )
    .expect("a valid file");
    assert_eq!(file.name.as_deref(), Some("billing-to-nats"));
    let settings = &file.settings;
    assert_eq!(settings.sink, Some(SinkKind::Nats));
    assert_eq!(settings.batch_deadline, Some(Duration::from_secs(2)));
    assert_eq!(settings.subject_prefix.as_deref(), Some("billing"));
    let flags = Settings {
        batch_deadline: Some(Duration::from_secs(5)),
        ..Settings::default()
    };
    let merged = flags.or(file.settings);
    assert_eq!(merged.batch_deadline, Some(Duration::from_secs(5)));
    assert_eq!(merged.sink, Some(SinkKind::Nats));
}

#[test]
fn a_bad_line_is_refused_naming_its_line_and_setting() {
    let unknown = parse_file("sink = nats\nbatch-sise = 10\n")
        .err()
        .unwrap_or_default();
    assert!(
        unknown.contains("line 2: unknown setting `batch-sise`"),
        "{unknown}"
    );
    let invalid = parse_file("batch-deadline = soon\n")
        .err()
        .unwrap_or_default();
    assert!(
        invalid.contains("line 1: setting `batch-deadline`") && invalid.contains("soon"),
        "{invalid}"
    );
    let no_equals = parse_file("sink nats\n").err().unwrap_or_default();
    assert!(
        no_equals.contains("line 1: expected `setting = value`"),
        "{no_equals}"
    );
    let nested = parse_file("config = other.conf\n")
        .err()
        .unwrap_or_default();
    assert!(nested.contains("unknown setting `config`"), "{nested}");
}

#[test]
fn a_setting_of_another_sink_is_named() {
    let settings = Settings {
        exchange: Some("orders".to_owned()),
        ..Settings::default()
    };
    assert_eq!(
        settings.foreign_to(SinkKind::Nats),
        Some(("exchange", SinkKind::Rabbitmq))
    );
    assert_eq!(settings.foreign_to(SinkKind::Rabbitmq), None);
}

#[test]
fn types_and_the_window_are_read_from_a_file() {
    let file = parse_file(
        "event-types = OrderPlaced, OrderShipped\nskip-untyped = true\nwindow-bytes = 16MiB\n",
    )
    .expect("a valid file");
    let settings = &file.settings;
    assert_eq!(
        settings.event_types.as_deref(),
        Some(&["OrderPlaced".to_owned(), " OrderShipped".to_owned()][..])
    );
    assert_eq!(settings.skip_untyped, Some(true));
    assert_eq!(settings.window_bytes, Some(16 << 20));
    assert_eq!(parse_bytes("4096"), Ok(4096));
    assert!(parse_bytes("16 MB").is_err_and(|e| e.contains("unit of size")));
    assert!(parse_bytes("lots").is_err_and(|e| e.contains("not a size")));
}

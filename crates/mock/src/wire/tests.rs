use super::*;

#[test]
fn parses_string_and_part_contents_and_counts_tokens() {
    let body = r#"{"model":"m","messages":[{"role":"system","content":"abcdefgh"},
            {"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"x"}}]},
            {"role":"assistant","content":null}],"max_tokens":9,"unknown":1}"#;
    let req: ChatRequest = serde_json::from_str(body).expect("parse");
    let p = Prompt::from_request(&req).expect("valid");
    assert_eq!(p.pieces().collect::<Vec<_>>(), ["abcdefgh", "abcd"]);
    assert_eq!(p.prompt_tokens(), 3 + (4 + 2) + (4 + 1) + 4);
    assert_eq!(p.max_tokens, Some(9));
    let (hex_sha, _) = p.hashes();
    // sha256("abcdefghabcd")
    assert_eq!(hex_sha.len(), 64);
    assert_eq!(hex(&[0x0f, 0xa0]), "0fa0");
}

#[test]
fn rejects_what_openai_rejects() {
    for body in [
        r#"{"messages":[{"role":"user","content":"x"}]}"#,
        r#"{"model":"m"}"#,
        r#"{"model":"m","messages":[]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}}"#,
    ] {
        let req: ChatRequest = serde_json::from_str(body).expect("parse");
        assert!(Prompt::from_request(&req).is_err(), "{body}");
    }
    assert!(
        serde_json::from_str::<ChatRequest>(r#"{"model":"m","messages":[{"content":5}]}"#).is_err()
    );
}

//! A stage that sends its rendered template as the request's whole body,
//! as written (`send_body`, `docket run --requests`): the body parsed, and
//! the model it goes to. Used by a synchronous send and a batch line alike.

use crate::stages::Stage;
use crate::template::Prompt;

/// For a stage that sends its rendered template as the request's body
/// (`docket run --requests`): that body, parsed, with the stage's model
/// put in when it overrides the body's or the body has none. None for
/// any other stage; Err (the item's error) when it is not a JSON object.
pub(crate) fn request_body(
    stage: &Stage,
    prompt: &Prompt,
) -> Result<Option<std::sync::Arc<serde_json::Value>>, String> {
    if !stage.send_body {
        return Ok(None);
    }
    let mut body = match serde_json::from_str::<serde_json::Value>(&prompt.user) {
        Ok(serde_json::Value::Object(body)) => body,
        Ok(_) => return Err("the request body is not a JSON object".into()),
        Err(e) => return Err(format!("the request body is not JSON: {e}")),
    };
    if stage.override_model || !body.get("model").is_some_and(serde_json::Value::is_string) {
        body.insert(
            "model".into(),
            serde_json::Value::from(stage.model.as_str()),
        );
    }
    Ok(Some(std::sync::Arc::new(serde_json::Value::Object(body))))
}

/// The model a request goes to: its body's when it is sent as written,
/// else the stage's.
pub(crate) fn body_model(stage: &Stage, body: Option<&serde_json::Value>) -> String {
    body.and_then(|b| b.get("model"))
        .and_then(serde_json::Value::as_str)
        .map_or_else(|| stage.model.clone(), str::to_string)
}

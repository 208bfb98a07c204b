//! Items: the things to decide. `docket import FILE` turns JSONL or CSV rows
//! into undecided `decision` rows (idempotent by item id).

mod import;

#[doc(hidden)]
pub use import::import_from;
pub use import::{
    BadRow, ImportError, ImportFormat, ImportOptions, ImportReport, MAX_BAD_ROW_DETAILS,
    MAX_ID_CHARS, MAX_ITEM_BYTES, TemplateCheck, TemplateCheckError, UnrenderableRow, import_file,
    import_file_checked, render_import_report,
};

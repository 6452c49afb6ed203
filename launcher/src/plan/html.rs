//! `railrun plan --html`: one self-contained page (placeholder until the views land).

use super::fabric_file::FabricFile;
use super::{PlanArgs, Table};

pub fn page(_ff: &FabricFile, _t: &Table, _a: &PlanArgs) -> Result<String, String> {
    Err("--html is not written yet".into())
}

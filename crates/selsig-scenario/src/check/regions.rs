//! The `[[region]]` tables: each memory region, its size, fill, protection domain and access.

use selsig::Access;

use crate::error::ScenarioError;
use crate::model::{Fill, Region};

use super::checker::{Checker, MAX_REGION, MAX_REGIONS_TOTAL};

impl Checker<'_> {
    /// The regions, in the file's order.
    pub fn regions(&self) -> Result<Vec<Region>, ScenarioError> {
        let raw = self.raw;
        let mut regions: Vec<Region> = Vec::new();
        let mut total = 0u64;
        for r in &raw.region {
            let span = Some(r.span());
            let r = r.get_ref();
            self.name_ok(&r.name, span.clone(), "region")?;
            if regions.iter().any(|x| x.name == r.name) {
                return Err(self.err(span, format!("a second region named {:?}", r.name)));
            }
            if r.size == 0 || r.size > MAX_REGION {
                return Err(self.err(
                    span,
                    format!(
                        "region {:?}: size {} is out of range 1..={MAX_REGION}",
                        r.name, r.size
                    ),
                ));
            }
            total += r.size;
            if total > MAX_REGIONS_TOTAL {
                return Err(self.err(
                    span,
                    format!(
                        "region {:?}: the regions take more than {MAX_REGIONS_TOTAL} bytes together",
                        r.name
                    ),
                ));
            }
            let fill = match &r.fill {
                None => Fill::Zero,
                Some(toml::Value::String(s)) if s == "zero" => Fill::Zero,
                Some(toml::Value::String(s)) if s == "pattern" => Fill::Pattern,
                Some(toml::Value::Integer(b)) if (0..=255).contains(b) => Fill::Byte(*b as u8),
                Some(other) => {
                    return Err(self.err(span, format!(
                        "region {:?}: fill {other} is not \"zero\", \"pattern\" or a byte 0..=255",
                        r.name
                    )));
                }
            };
            let other_pd = match r.pd.as_str() {
                "main" => false,
                "other" => true,
                p => {
                    return Err(self.err(
                        span,
                        format!("region {:?}: pd {p:?} is not \"main\" or \"other\"", r.name),
                    ));
                }
            };
            let access = self.access(&r.access, span.clone(), &format!("region {:?}", r.name))?;
            if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
                && !access.contains(Access::LOCAL_WRITE)
            {
                return Err(self.err(
                    span,
                    format!(
                        "region {:?}: remote_write and remote_atomic need local_write too (as \
                         ibv_reg_mr)",
                        r.name
                    ),
                ));
            }
            regions.push(Region {
                name: r.name.clone(),
                size: r.size as usize,
                access,
                fill,
                other_pd,
            });
        }
        Ok(regions)
    }
}

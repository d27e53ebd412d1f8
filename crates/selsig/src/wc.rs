//! Work completions: the status and opcode sets of `ibv_wc`, decoded without panics.

/// Why a raw value could not be decoded into one of this module's enums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} value {value}")]
pub struct UnknownValue {
    /// The kind of value (`ibv_wc_status`, `ibv_wc_opcode`, ...).
    pub what: &'static str,
    /// The raw value that was not recognised.
    pub value: u32,
}

macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $cname:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, $cstr:literal, $short:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $value, )*
        }

        impl $name {
            /// Every variant, in the order of the C enum.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The C name of the value (`IBV_WC_...`).
            pub const fn c_name(self) -> &'static str {
                match self {
                    $( $name::$variant => $cstr, )*
                }
            }

            /// The short lowercase name used in traces (the C name without `IBV_WC_`).
            pub const fn short_name(self) -> &'static str {
                match self {
                    $( $name::$variant => $short, )*
                }
            }
        }

        impl TryFrom<u32> for $name {
            type Error = UnknownValue;
            fn try_from(value: u32) -> Result<Self, UnknownValue> {
                match value {
                    $( v if v == $value => Ok($name::$variant), )*
                    _ => Err(UnknownValue { what: $cname, value }),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.short_name())
            }
        }

        impl From<$name> for u32 {
            fn from(v: $name) -> u32 {
                v as u32
            }
        }
    };
}

c_enum! {
    /// The status of a work completion (`enum ibv_wc_status`).
    pub enum WcStatus: "ibv_wc_status" {
        /// The work request completed successfully.
        Success = 0, "IBV_WC_SUCCESS", "success";
        /// Local length error.
        LocLenErr = 1, "IBV_WC_LOC_LEN_ERR", "loc_len_err";
        /// Local QP operation error.
        LocQpOpErr = 2, "IBV_WC_LOC_QP_OP_ERR", "loc_qp_op_err";
        /// Local EE context operation error.
        LocEecOpErr = 3, "IBV_WC_LOC_EEC_OP_ERR", "loc_eec_op_err";
        /// Local protection error (bad lkey, address outside the region).
        LocProtErr = 4, "IBV_WC_LOC_PROT_ERR", "loc_prot_err";
        /// Flushed: the queue was in the error state.
        WrFlushErr = 5, "IBV_WC_WR_FLUSH_ERR", "wr_flush_err";
        /// Memory window bind error.
        MwBindErr = 6, "IBV_WC_MW_BIND_ERR", "mw_bind_err";
        /// Bad response error.
        BadRespErr = 7, "IBV_WC_BAD_RESP_ERR", "bad_resp_err";
        /// Local access error.
        LocAccessErr = 8, "IBV_WC_LOC_ACCESS_ERR", "loc_access_err";
        /// Remote invalid request error.
        RemInvReqErr = 9, "IBV_WC_REM_INV_REQ_ERR", "rem_inv_req_err";
        /// Remote access error (bad rkey, bounds, access flags).
        RemAccessErr = 10, "IBV_WC_REM_ACCESS_ERR", "rem_access_err";
        /// Remote operation error.
        RemOpErr = 11, "IBV_WC_REM_OP_ERR", "rem_op_err";
        /// Transport retry counter exceeded.
        RetryExcErr = 12, "IBV_WC_RETRY_EXC_ERR", "retry_exc_err";
        /// RNR retry counter exceeded.
        RnrRetryExcErr = 13, "IBV_WC_RNR_RETRY_EXC_ERR", "rnr_retry_exc_err";
        /// Local RDD violation error.
        LocRddViolErr = 14, "IBV_WC_LOC_RDD_VIOL_ERR", "loc_rdd_viol_err";
        /// Remote invalid RD request.
        RemInvRdReqErr = 15, "IBV_WC_REM_INV_RD_REQ_ERR", "rem_inv_rd_req_err";
        /// Remote aborted error.
        RemAbortErr = 16, "IBV_WC_REM_ABORT_ERR", "rem_abort_err";
        /// Invalid EE context number.
        InvEecnErr = 17, "IBV_WC_INV_EECN_ERR", "inv_eecn_err";
        /// Invalid EE context state.
        InvEecStateErr = 18, "IBV_WC_INV_EEC_STATE_ERR", "inv_eec_state_err";
        /// Fatal error.
        FatalErr = 19, "IBV_WC_FATAL_ERR", "fatal_err";
        /// Response timeout error.
        RespTimeoutErr = 20, "IBV_WC_RESP_TIMEOUT_ERR", "resp_timeout_err";
        /// General error.
        GeneralErr = 21, "IBV_WC_GENERAL_ERR", "general_err";
        /// Tag matching error.
        TmErr = 22, "IBV_WC_TM_ERR", "tm_err";
        /// Tag matching rendezvous incomplete.
        TmRndvIncomplete = 23, "IBV_WC_TM_RNDV_INCOMPLETE", "tm_rndv_incomplete";
    }
}

impl WcStatus {
    /// `true` for [`WcStatus::Success`].
    pub const fn is_success(self) -> bool {
        matches!(self, WcStatus::Success)
    }

    /// `true` for [`WcStatus::WrFlushErr`].
    pub const fn is_flush(self) -> bool {
        matches!(self, WcStatus::WrFlushErr)
    }
}

c_enum! {
    /// The operation of a work completion (`enum ibv_wc_opcode`).
    ///
    /// Only valid in a successful completion: an error completion's opcode is
    /// meaningless (`ibv_poll_cq(3)`).
    pub enum WcOpcode: "ibv_wc_opcode" {
        /// A SEND completed on the send queue.
        Send = 0, "IBV_WC_SEND", "send";
        /// An RDMA WRITE (with or without immediate) completed.
        RdmaWrite = 1, "IBV_WC_RDMA_WRITE", "rdma_write";
        /// An RDMA READ completed.
        RdmaRead = 2, "IBV_WC_RDMA_READ", "rdma_read";
        /// An atomic compare-and-swap completed.
        CompSwap = 3, "IBV_WC_COMP_SWAP", "comp_swap";
        /// An atomic fetch-and-add completed.
        FetchAdd = 4, "IBV_WC_FETCH_ADD", "fetch_add";
        /// A memory window bind completed.
        BindMw = 5, "IBV_WC_BIND_MW", "bind_mw";
        /// A local invalidate completed.
        LocalInv = 6, "IBV_WC_LOCAL_INV", "local_inv";
        /// A TSO send completed.
        Tso = 7, "IBV_WC_TSO", "tso";
        /// A FLUSH (to persistence) completed.
        Flush = 8, "IBV_WC_FLUSH", "flush";
        /// An ATOMIC WRITE completed.
        AtomicWrite = 9, "IBV_WC_ATOMIC_WRITE", "atomic_write";
        /// A receive completed (the peer's SEND).
        Recv = 128, "IBV_WC_RECV", "recv";
        /// A receive consumed by the peer's RDMA WRITE with immediate.
        RecvRdmaWithImm = 129, "IBV_WC_RECV_RDMA_WITH_IMM", "recv_rdma_with_imm";
        /// Tag matching: add.
        TmAdd = 130, "IBV_WC_TM_ADD", "tm_add";
        /// Tag matching: delete.
        TmDel = 131, "IBV_WC_TM_DEL", "tm_del";
        /// Tag matching: sync.
        TmSync = 132, "IBV_WC_TM_SYNC", "tm_sync";
        /// Tag matching: receive.
        TmRecv = 133, "IBV_WC_TM_RECV", "tm_recv";
        /// Tag matching: no tag.
        TmNoTag = 134, "IBV_WC_TM_NO_TAG", "tm_no_tag";
        /// Driver specific.
        Driver1 = 135, "IBV_WC_DRIVER1", "driver1";
        /// Driver specific.
        Driver2 = 136, "IBV_WC_DRIVER2", "driver2";
        /// Driver specific.
        Driver3 = 137, "IBV_WC_DRIVER3", "driver3";
    }
}

impl WcOpcode {
    /// `true` for completions of the receive queue (`opcode & IBV_WC_RECV`).
    pub const fn is_recv(self) -> bool {
        (self as u32) & 128 != 0
    }

    /// `true` where a completion's `byte_len` is defined: receives, RDMA READs and atomics.
    /// Other send completions leave it unset (mlx5's `handle_good_req` does not write it).
    /// rxe writes the work request's length into every successful send completion
    /// (`make_send_cqe` in `rxe_comp.c`), `Flush` and `AtomicWrite` included, which only rxe
    /// produces; selsig reports only what every provider defines, so those read 0 too.
    pub const fn has_byte_len(self) -> bool {
        self.is_recv()
            || matches!(
                self,
                WcOpcode::RdmaRead | WcOpcode::CompSwap | WcOpcode::FetchAdd
            )
    }
}

/// One completion read from a completion queue (the fields of `ibv_wc` selsig uses).
///
/// In an error completion only `wr_id`, `status`, `qp_num` and `vendor_err` are valid. A
/// provider gives 0 (`None`) in the fields a completion does not define (both of selsig's
/// do), so that two completions compare equal when what they define is equal; the driver
/// reads no field of an error completion beyond those four.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The `wr_id` of the work request (on a [`SignaledQueue`](crate::SignaledQueue)'s
    /// sends, the sequence number with bit 63 set: [`SendTracker::wr_id`](crate::SendTracker::wr_id)).
    pub wr_id: u64,
    /// The completion status.
    pub status: WcStatus,
    /// The operation; `None` where the provider reported a value outside the known set
    /// (always the case for meaningless opcodes of error completions).
    pub opcode: Option<WcOpcode>,
    /// Bytes transferred, where defined ([`WcOpcode::has_byte_len`]: receives, READs,
    /// atomics); 0 otherwise.
    pub byte_len: u32,
    /// The QP number the completion belongs to.
    pub qp_num: u32,
    /// Immediate data, host order, when a receive completion carries any (a send
    /// completion never does, even of a WRITE or SEND with immediate).
    pub imm_data: Option<u32>,
    /// Vendor error syndrome (error completions only; 0 otherwise).
    pub vendor_err: u32,
}

impl WorkCompletion {
    /// A completion with the given id, status and QP number, the other fields empty.
    pub const fn new(wr_id: u64, status: WcStatus, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode: None,
            byte_len: 0,
            qp_num,
            imm_data: None,
            vendor_err: 0,
        }
    }

    /// Sets the opcode.
    pub const fn with_opcode(mut self, opcode: WcOpcode) -> Self {
        self.opcode = Some(opcode);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_match_verbs_h() {
        assert_eq!(WcStatus::ALL.len(), 24);
        for (i, s) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
            assert_eq!(WcStatus::try_from(i as u32), Ok(*s));
            assert_eq!(
                s.short_name(),
                s.c_name().trim_start_matches("IBV_WC_").to_lowercase()
            );
        }
        assert_eq!(WcStatus::RemAccessErr as u32, 10);
        assert_eq!(WcStatus::WrFlushErr as u32, 5);
    }

    #[test]
    fn unknown_values_are_errors_not_panics() {
        let err = WcStatus::try_from(24).unwrap_err();
        assert_eq!(err.to_string(), "unknown ibv_wc_status value 24");
        for v in [10, 127, 138, u32::MAX] {
            let err = WcOpcode::try_from(v).unwrap_err();
            assert_eq!((err.what, err.value), ("ibv_wc_opcode", v));
        }
    }

    #[test]
    fn only_success_is_a_success_and_only_a_flush_a_flush() {
        for &s in WcStatus::ALL {
            assert_eq!(s.is_success(), s == WcStatus::Success, "{s}");
            assert_eq!(s.is_flush(), s == WcStatus::WrFlushErr, "{s}");
        }
    }

    #[test]
    fn opcode_values_match_verbs_h() {
        // rdma-core's `enum ibv_wc_opcode`, every value.
        let verbs_h = [
            (0, "IBV_WC_SEND"),
            (1, "IBV_WC_RDMA_WRITE"),
            (2, "IBV_WC_RDMA_READ"),
            (3, "IBV_WC_COMP_SWAP"),
            (4, "IBV_WC_FETCH_ADD"),
            (5, "IBV_WC_BIND_MW"),
            (6, "IBV_WC_LOCAL_INV"),
            (7, "IBV_WC_TSO"),
            (8, "IBV_WC_FLUSH"),
            (9, "IBV_WC_ATOMIC_WRITE"),
            (128, "IBV_WC_RECV"),
            (129, "IBV_WC_RECV_RDMA_WITH_IMM"),
            (130, "IBV_WC_TM_ADD"),
            (131, "IBV_WC_TM_DEL"),
            (132, "IBV_WC_TM_SYNC"),
            (133, "IBV_WC_TM_RECV"),
            (134, "IBV_WC_TM_NO_TAG"),
            (135, "IBV_WC_DRIVER1"),
            (136, "IBV_WC_DRIVER2"),
            (137, "IBV_WC_DRIVER3"),
        ];
        assert_eq!(WcOpcode::ALL.len(), verbs_h.len());
        for (&o, (value, c_name)) in WcOpcode::ALL.iter().zip(verbs_h) {
            assert_eq!((u32::from(o), o.c_name()), (value, c_name));
            assert_eq!(WcOpcode::try_from(value), Ok(o));
            assert_eq!(o.is_recv(), value & 128 != 0, "{o}");
            assert_eq!(
                o.short_name(),
                o.c_name().trim_start_matches("IBV_WC_").to_lowercase()
            );
        }
    }

    #[test]
    fn byte_len_is_defined_for_receives_reads_and_atomics() {
        use WcOpcode::*;
        for o in [Recv, RecvRdmaWithImm, RdmaRead, CompSwap, FetchAdd] {
            assert!(o.has_byte_len(), "{o}");
        }
        for o in [Send, RdmaWrite, BindMw, LocalInv, Flush, AtomicWrite] {
            assert!(!o.has_byte_len(), "{o}");
        }
    }

    #[test]
    fn a_new_completion_defines_only_what_it_is_given() {
        let wc = WorkCompletion::new(1, WcStatus::RemAccessErr, 2);
        let empty = WorkCompletion {
            wr_id: 1,
            status: WcStatus::RemAccessErr,
            opcode: None,
            byte_len: 0,
            qp_num: 2,
            imm_data: None,
            vendor_err: 0,
        };
        assert_eq!(wc, empty);
        assert_eq!(wc.with_opcode(WcOpcode::Send).opcode, Some(WcOpcode::Send));
    }
}

//! topo_cmd
